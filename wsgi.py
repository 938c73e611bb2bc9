from app import create_app, start_scheduler, warn_about_configuration

app = create_app()
warn_about_configuration(app)
start_scheduler(app)
