"""A job's timeline, written inside the job transactions: its attempts, its events, and when
each worker key was last seen. app/history reads it (GET /jobs/<id>/attempts, events, explain).
"""
