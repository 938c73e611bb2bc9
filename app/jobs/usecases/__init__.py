"""What the service does with jobs, a use case a module: enqueue, claim, report, read, act as
an admin, reserve, and the maintenance the leader runs. Each runs its work in a job
transaction (app/jobs/tx)."""
