"""The HTTP edge of jobs: the routes, what their bodies and queries may hold, and how a job
is shown in an answer. Thin: each route loads, calls one use case, and renders."""
