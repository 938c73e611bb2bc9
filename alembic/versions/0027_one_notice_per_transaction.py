"""One notice per transaction (docs/SCALING.md, "The database tells every host"): on
PostgreSQL, a committing transaction sends at most one notification on the channel
`queuelog`, where 0025's triggers sent one per statement with a different payload.

- A job's end that may free another job in the same transaction (an unapplied dependency
  edge waits on it, or it holds its ordered key's turn) is told as 'claimable finished' by
  the end's own statement while a claim waits: the dependents or the key's next job that the
  transaction then releases are told by that notice, which PostgreSQL delivers at the commit,
  after the release.
- Each transaction remembers what it told (the setting `queuelog.told`, local to the
  transaction): a later statement tells only a kind not told yet. PostgreSQL folds equal
  notifications of a transaction; these would have differed.
- A schedule tells 'schedules' when its settings change (created, edited, deleted), no longer
  when it fires: firing moves its next slot on in the transaction that inserts the slot's job
  (which tells 'claimable'), and another host's ticker, which wakes at the slot it had
  computed, finds it moved on and computes the next itself.

Nothing changes on SQLite, which has no notifications.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

_JOBS_FUNCTION = """
CREATE OR REPLACE FUNCTION queuelog_notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  now_us bigint;
  claimable boolean := false;
  finished boolean := false;
  frees boolean := false;
  told text;
  tell text[] := '{}';
BEGIN
  IF current_setting('queuelog.notify', true) = 'off' THEN
    RETURN NULL;
  END IF;
  now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
  -- Nobody waits (a busy queue's workers are busy): nothing to tell, no lock to take.
  IF NOT EXISTS (SELECT 1 FROM job_waiters WHERE until_at > now_us) THEN
    RETURN NULL;
  END IF;
  told := coalesce(current_setting('queuelog.told', true), '');
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
    -- An end that may free another job in this transaction: told now, delivered at commit.
    IF NOT claimable AND position('claimable' IN told) = 0
       AND EXISTS (SELECT 1 FROM job_waiters w
                   WHERE w.until_at > now_us AND w.waits_for = 'claims') THEN
      SELECT EXISTS (SELECT 1 FROM new_rows n JOIN old_rows o ON o.id = n.id
                     WHERE n.status IN ('completed', 'failed', 'cancelled')
                       AND o.status NOT IN ('completed', 'failed', 'cancelled')
                       AND (EXISTS (SELECT 1 FROM job_dependencies d
                                    WHERE d.depends_on_id = n.id AND d.resolved = 0)
                            OR EXISTS (SELECT 1 FROM key_turns k WHERE k.job_id = n.id)))
        INTO frees;
      claimable := frees;
    END IF;
  END IF;
  IF claimable AND position('claimable' IN told) = 0 THEN
    tell := tell || 'claimable'::text;
  END IF;
  IF finished AND position('finished' IN told) = 0 THEN
    tell := tell || 'finished'::text;
  END IF;
  IF cardinality(tell) > 0 THEN
    PERFORM pg_notify('queuelog', array_to_string(tell, ' '));
    PERFORM set_config('queuelog.told', told || ' ' || array_to_string(tell, ' '), true);
  END IF;
  RETURN NULL;
END $$
"""

_JOBS_FUNCTION_0025 = """
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
DECLARE
  told text;
BEGIN
  IF current_setting('queuelog.notify', true) IS DISTINCT FROM 'off' THEN
    told := coalesce(current_setting('queuelog.told', true), '');
    IF position(TG_ARGV[0] IN told) = 0 THEN
      PERFORM pg_notify('queuelog', TG_ARGV[0]);
      PERFORM set_config('queuelog.told', told || ' ' || TG_ARGV[0], true);
    END IF;
  END IF;
  RETURN NULL;
END $$
"""

_KIND_FUNCTION_0025 = """
CREATE OR REPLACE FUNCTION queuelog_notify_kind() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('queuelog.notify', true) IS DISTINCT FROM 'off' THEN
    PERFORM pg_notify('queuelog', TG_ARGV[0]);
  END IF;
  RETURN NULL;
END $$
"""

# A schedule's settings, which every PATCH writes some of; not next_run_at, last_run_at nor
# last_job_id, which firing moves on.
_SCHEDULE_SETTINGS = "cron, timezone, job, catch_up, paused, updated_at"


def _schedules_trigger(columns: str) -> str:
    return (f"CREATE TRIGGER queuelog_schedules_changed AFTER INSERT OR DELETE OR UPDATE{columns} "
            "ON schedules FOR EACH ROW EXECUTE FUNCTION queuelog_notify_kind('schedules')")


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    op.execute(sa.text(_JOBS_FUNCTION))
    op.execute(sa.text(_KIND_FUNCTION))
    op.execute(sa.text("DROP TRIGGER queuelog_schedules_changed ON schedules"))
    op.execute(sa.text(_schedules_trigger(f" OF {_SCHEDULE_SETTINGS}")))


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    op.execute(sa.text("DROP TRIGGER queuelog_schedules_changed ON schedules"))
    op.execute(sa.text(_schedules_trigger("")))
    op.execute(sa.text(_KIND_FUNCTION_0025))
    op.execute(sa.text(_JOBS_FUNCTION_0025))
