from app import create_app, warn_about_configuration

app = create_app()
warn_about_configuration(app)
