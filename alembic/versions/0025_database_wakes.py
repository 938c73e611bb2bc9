"""Database wakes: PostgreSQL tells every listening host what changed (docs/SCALING.md, "The
database tells every host"), and delayed jobs get an index of their own.

- On PostgreSQL, triggers send one NOTIFY on the channel `queuelog` per statement that
  changes what a waiting process acts on: 'claimable' (a job became pending and
  due), 'finished' (a job became completed, failed or cancelled), 'types' (a type's settings
  changed; the token bucket and last claim, written by claims, are not settings) and
  'schedules'. The payload names the kinds, space-separated, so a statement sends one
  notification, and PostgreSQL folds equal ones within a transaction. A session that sets
  `queuelog.notify = off` sends none (QUEUELOG_NOTIFY=off). The triggers run in the sending
  statement: no round trip is added to any request.
- The jobs' notices go out only while some process's requests wait for them: each such
  process keeps rows in job_waiters (until when it waits, refreshed while it does): its
  waiting claims' types ('claims'; no types: any), its waiting reads ('reads'). A job made
  claimable is told only while a claim waits for its type; a job's end while a read waits, or
  a claim for its type (an end may free a place a claim waits for). PostgreSQL takes a lock for the whole server at
  the commit of a transaction that notified, held until its commit is flushed, so notifying
  commits go one at a time: with nobody waiting (a busy queue's workers are busy), enqueues
  pay none of it. Unlogged: a crash loses it, and the next wait writes it again.
- On both engines, ix_jobs_delayed_run_at holds the pending jobs whose run_at is later than
  their creation (delayed and retried jobs, nothing an immediate enqueue writes), so that the
  maintenance leader can tell when the next one comes due without reading the backlog.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_DELAYED = "status = 'pending' AND run_at > created_at"

_JOBS_FUNCTION = """
CREATE OR REPLACE FUNCTION queuelog_notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  now_us bigint;
  claimable boolean := false;
  finished boolean := false;
BEGIN
  IF current_setting('queuelog.notify', true) = 'off' THEN
    RETURN NULL;
  END IF;
  now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
  -- Nobody waits (a busy queue's workers are busy): nothing to tell, no lock to take.
  IF NOT EXISTS (SELECT 1 FROM job_waiters WHERE until_at > now_us) THEN
    RETURN NULL;
  END IF;
  IF TG_OP = 'INSERT' THEN
    SELECT EXISTS (SELECT 1 FROM new_rows n JOIN job_waiters w
                     ON w.until_at > now_us AND w.waits_for = 'claims'
                    AND (w.types IS NULL OR n.type = ANY (string_to_array(w.types, ',')))
                   WHERE n.status = 'pending' AND (n.run_at <= n.created_at OR n.run_at <= now_us))
      INTO claimable;
  ELSE
    SELECT EXISTS (SELECT 1 FROM new_rows n JOIN old_rows o ON o.id = n.id
                   JOIN job_waiters w
                     ON w.until_at > now_us AND w.waits_for = 'claims'
                    AND (w.types IS NULL OR n.type = ANY (string_to_array(w.types, ',')))
                   WHERE n.status = 'pending' AND n.run_at <= now_us
                     AND (o.status <> 'pending' OR o.run_at <> n.run_at)),
           EXISTS (SELECT 1 FROM new_rows n JOIN old_rows o ON o.id = n.id
                   JOIN job_waiters w
                     ON w.until_at > now_us
                    AND (w.waits_for = 'reads' OR w.types IS NULL
                         OR n.type = ANY (string_to_array(w.types, ',')))
                   WHERE n.status IN ('completed', 'failed', 'cancelled')
                     AND o.status NOT IN ('completed', 'failed', 'cancelled'))
      INTO claimable, finished;
  END IF;
  IF claimable AND finished THEN
    PERFORM pg_notify('queuelog', 'claimable finished');
  ELSIF claimable THEN
    PERFORM pg_notify('queuelog', 'claimable');
  ELSIF finished THEN
    PERFORM pg_notify('queuelog', 'finished');
  END IF;
  RETURN NULL;
END $$
"""

_KIND_FUNCTION = """
CREATE OR REPLACE FUNCTION queuelog_notify_kind() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('queuelog.notify', true) IS DISTINCT FROM 'off' THEN
    PERFORM pg_notify('queuelog', TG_ARGV[0]);
  END IF;
  RETURN NULL;
END $$
"""

# The columns of job_types a process keeps a copy of: not tokens, tokens_at, last_claim_at
# (claims write them) nor updated_at.
_TYPE_SETTINGS = ("paused, max_running, max_running_per_key, rate_per_second, burst, push_url, "
                  "push_timeout_seconds, push_secret, fairness, ordering, on_failure, "
                  "retention_completed_seconds, retention_failed_seconds, "
                  "retention_cancelled_seconds, key_scope")

_TRIGGERS = (
    "CREATE TRIGGER queuelog_jobs_inserted AFTER INSERT ON jobs "
    "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION queuelog_notify_jobs()",
    "CREATE TRIGGER queuelog_jobs_updated AFTER UPDATE ON jobs "
    "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
    "FOR EACH STATEMENT EXECUTE FUNCTION queuelog_notify_jobs()",
    # Row triggers: a statement that changes no row (a claim's insert of a type's row that
    # exists already) tells nobody; equal notices of one transaction are folded into one.
    f"CREATE TRIGGER queuelog_types_changed AFTER INSERT OR DELETE OR UPDATE OF {_TYPE_SETTINGS} "
    "ON job_types FOR EACH ROW EXECUTE FUNCTION queuelog_notify_kind('types')",
    "CREATE TRIGGER queuelog_schedules_changed AFTER INSERT OR UPDATE OR DELETE ON schedules "
    "FOR EACH ROW EXECUTE FUNCTION queuelog_notify_kind('schedules')",
)


def upgrade() -> None:
    op.create_index("ix_jobs_delayed_run_at", "jobs", ["run_at"],
                    sqlite_where=sa.text(_DELAYED), postgresql_where=sa.text(_DELAYED))
    op.create_table(
        "job_waiters",
        sa.Column("waiter", sa.String(200), nullable=False),
        sa.Column("waits_for", sa.String(8), nullable=False),
        sa.Column("types", sa.Text(), nullable=True),
        sa.Column("until_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("waiter", "waits_for", name=op.f("pk_job_waiters")),
    )
    if op.get_context().dialect.name != "postgresql":
        return
    op.execute(sa.text("ALTER TABLE job_waiters SET UNLOGGED"))
    op.execute(sa.text(_JOBS_FUNCTION))
    op.execute(sa.text(_KIND_FUNCTION))
    for trigger in _TRIGGERS:
        op.execute(sa.text(trigger))


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(sa.text("DROP TRIGGER IF EXISTS queuelog_schedules_changed ON schedules"))
        op.execute(sa.text("DROP TRIGGER IF EXISTS queuelog_types_changed ON job_types"))
        op.execute(sa.text("DROP TRIGGER IF EXISTS queuelog_jobs_updated ON jobs"))
        op.execute(sa.text("DROP TRIGGER IF EXISTS queuelog_jobs_inserted ON jobs"))
        op.execute(sa.text("DROP FUNCTION IF EXISTS queuelog_notify_kind()"))
        op.execute(sa.text("DROP FUNCTION IF EXISTS queuelog_notify_jobs()"))
    op.drop_table("job_waiters")
    op.drop_index("ix_jobs_delayed_run_at", table_name="jobs")
