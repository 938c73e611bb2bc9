"""Keys per producer: an ordered or fair key is (type, producer, concurrency_key), as
idempotency and unique keys already are; a type's keys may be declared shared.

- job_types.key_scope: NULL (each producer's keys are its own) or 'shared' (one key for
  every producer, as every earlier release had it).
- key_turns.producer, in its primary key: the producer key whose key it is ('' for a shared
  type's keys). The table is made again (a primary key cannot be altered on SQLite).
- jobs.fair_key_round: a fair type's pending job's round among its producer's keys
  (fair_round is then its round among the producers), and its partial indexes
  ix_jobs_fair_producer_key and ix_jobs_fair_producer_order; ix_jobs_fair_order (round
  order) made again with it after the round; ix_jobs_waiting_producer_key, a producer's
  key's oldest waiting job.

The stored jobs are brought under the new keys once, here: each ordered type's turns are
made again per producer (a key's turn stays with its job; another producer's jobs of the
same key string get a turn of their own, the oldest running else the oldest unfinished, and
the one that now has the turn and no unfinished dependency becomes pending; a failure that
blocks its key blocks its producer's key), and each fair type's pending jobs are numbered
again per producer. No event is recorded: the upgrade is their reason.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

import time

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
FAIR_ROWS = sa.text("status = 'pending' AND fair_round >= 0")
WAITING_KEYED_ROWS = sa.text("status = 'waiting' AND concurrency_key IS NOT NULL")

jobs = sa.table("jobs", sa.column("id"), sa.column("type"), sa.column("producer"),
                sa.column("status"), sa.column("concurrency_key"), sa.column("priority"),
                sa.column("created_at"), sa.column("updated_at"), sa.column("run_at"),
                sa.column("fair_round"), sa.column("fair_key_round"))
key_turns = sa.table("key_turns", sa.column("type"), sa.column("producer"),
                     sa.column("concurrency_key"), sa.column("job_id"), sa.column("blocked"),
                     sa.column("since"))
job_types = sa.table("job_types", sa.column("type"), sa.column("fairness"),
                     sa.column("ordering"))
job_dependencies = sa.table("job_dependencies", sa.column("job_id"), sa.column("resolved"))
UNFINISHED = ("pending", "running", "waiting")


def _make_key_turns(with_producer: bool) -> None:
    columns = [sa.Column("type", sa.String(100), nullable=False)]
    if with_producer:
        columns.append(sa.Column("producer", sa.String(100), nullable=False))
    columns += [sa.Column("concurrency_key", sa.String(255), nullable=False),
                sa.Column("job_id", Id, nullable=False),
                sa.Column("blocked", sa.SmallInteger(), nullable=False),
                sa.Column("since", sa.BigInteger(), nullable=False)]
    key = ["type", "producer", "concurrency_key"] if with_producer else ["type",
                                                                         "concurrency_key"]
    op.create_table("key_turns", *columns, sa.PrimaryKeyConstraint(*key, name="pk_key_turns"))
    op.create_index("ix_key_turns_job_id", "key_turns", ["job_id"])
    op.create_index("ix_key_turns_blocked", "key_turns", ["blocked", "type", "concurrency_key"],
                    sqlite_where=sa.text("blocked = 1"), postgresql_where=sa.text("blocked = 1"))


def _set_aside_key_turns() -> None:
    op.drop_index("ix_key_turns_blocked", table_name="key_turns")
    op.drop_index("ix_key_turns_job_id", table_name="key_turns")
    op.rename_table("key_turns", "key_turns_before")
    if op.get_bind().dialect.name == "postgresql":
        # A primary key's name is its index's, one per schema.
        op.execute("ALTER TABLE key_turns_before RENAME CONSTRAINT pk_key_turns "
                   "TO pk_key_turns_before")


def upgrade() -> None:
    op.add_column("job_types", sa.Column("key_scope", sa.String(8), nullable=True))
    op.add_column("jobs", sa.Column("fair_key_round", sa.BigInteger(), nullable=True))
    # Round order gains the round among a producer's keys, before claim order.
    op.drop_index("ix_jobs_fair_order", table_name="jobs")
    op.create_index("ix_jobs_fair_order", "jobs",
                    ["type", sa.text("priority DESC"), "fair_round", "fair_key_round",
                     "created_at", "id", "run_at"],
                    sqlite_where=FAIR_ROWS, postgresql_where=FAIR_ROWS)
    op.create_index("ix_jobs_fair_producer_key", "jobs",
                    ["type", "producer", "concurrency_key", "fair_key_round"],
                    sqlite_where=FAIR_ROWS, postgresql_where=FAIR_ROWS)
    op.create_index("ix_jobs_fair_producer_order", "jobs",
                    ["type", "producer", "fair_key_round", "id", "fair_round"],
                    sqlite_where=FAIR_ROWS, postgresql_where=FAIR_ROWS)
    op.create_index("ix_jobs_waiting_producer_key", "jobs",
                    ["type", "producer", "concurrency_key", "id"],
                    sqlite_where=WAITING_KEYED_ROWS, postgresql_where=WAITING_KEYED_ROWS)
    _set_aside_key_turns()
    _make_key_turns(with_producer=True)
    conn = op.get_bind()
    now = int(time.time() * 1_000_000)
    before = sa.table("key_turns_before", sa.column("type"), sa.column("concurrency_key"),
                      sa.column("job_id"), sa.column("blocked"), sa.column("since"))
    old_turns = conn.execute(sa.select(before.c.type, before.c.concurrency_key,
                                       before.c.job_id, before.c.blocked,
                                       before.c.since)).all()
    op.drop_table("key_turns_before")
    ordered = {row[0] for row in conn.execute(
        sa.select(job_types.c.type).where(job_types.c.ordering == "key"))}
    fair = {row[0] for row in conn.execute(
        sa.select(job_types.c.type).where(job_types.c.fairness == "key"))}
    _turns_per_producer(conn, old_turns, ordered, now)
    for job_type in sorted(fair):
        _number_per_producer(conn, job_type, now)


def _turns_per_producer(conn: sa.Connection, old_turns: list[sa.Row], ordered: set[str],
                        now: int) -> None:
    producer_of = {}
    ids = [row[2] for row in old_turns]
    for start in range(0, len(ids), 500):
        producer_of.update(conn.execute(sa.select(jobs.c.id, jobs.c.producer).where(
            jobs.c.id.in_(ids[start:start + 500]))).all())
    turns: dict[tuple[str, str, str], dict[str, object]] = {}
    for job_type, key, job_id, blocked, since in old_turns:
        if job_type in ordered and job_id in producer_of:
            turns[(job_type, producer_of[job_id], key)] = {
                "job_id": job_id, "blocked": blocked, "since": since}
    for job_type in sorted(ordered):
        groups = conn.execute(
            sa.select(jobs.c.producer, jobs.c.concurrency_key,
                      sa.func.coalesce(sa.func.min(sa.case((jobs.c.status == "running",
                                                            jobs.c.id))),
                                       sa.func.min(jobs.c.id)))
            .where(jobs.c.type == job_type, jobs.c.concurrency_key.is_not(None),
                   jobs.c.status.in_(UNFINISHED))
            .group_by(jobs.c.producer, jobs.c.concurrency_key)).all()
        for producer, key, job_id in groups:
            turns.setdefault((job_type, producer, key),
                             {"job_id": job_id, "blocked": 0, "since": now})
    rows = [{"type": t, "producer": p, "concurrency_key": k, **turn}
            for (t, p, k), turn in turns.items()]
    for start in range(0, len(rows), 500):
        conn.execute(key_turns.insert(), rows[start:start + 500])
    for job_type in sorted(ordered):
        holds_turn = jobs.c.id.in_(sa.select(key_turns.c.job_id)
                                   .where(key_turns.c.type == job_type))
        keyed = sa.and_(jobs.c.type == job_type, jobs.c.concurrency_key.is_not(None))
        unfinished_dependency = (sa.select(job_dependencies.c.job_id)
                                 .where(job_dependencies.c.job_id == jobs.c.id,
                                        job_dependencies.c.resolved == 0)
                                 .exists())
        # Another producer's job of the key held this one back: its own key's turn now.
        conn.execute(sa.update(jobs)
                     .where(keyed, jobs.c.status == "waiting", holds_turn,
                            ~unfinished_dependency)
                     .values(status="pending", updated_at=now, fair_round=None,
                             run_at=sa.case((jobs.c.run_at < now, now),
                                            else_=jobs.c.run_at)))


def _number_per_producer(conn: sa.Connection, job_type: str, now: int) -> None:
    """As app/jobs/sql/key_repository.py numbers a fair type whose keys are per producer."""
    conn.execute(sa.update(jobs).where(jobs.c.type == job_type, jobs.c.status == "pending")
                 .values(fair_round=None, fair_key_round=None))
    by_key = (sa.select(jobs.c.id, jobs.c.producer, (sa.func.row_number().over(
        partition_by=[jobs.c.producer, jobs.c.concurrency_key],
        order_by=(jobs.c.priority.desc(), jobs.c.created_at, jobs.c.id)) - 1).label("n"))
        .where(jobs.c.type == job_type, jobs.c.status == "pending", jobs.c.run_at <= now)
        .subquery("by_key"))
    by_producer = (sa.select(by_key.c.id, by_key.c.n, (sa.func.row_number().over(
        partition_by=by_key.c.producer, order_by=(by_key.c.n, by_key.c.id)) - 1)
        .label("turn")).subquery("by_producer"))
    conn.execute(sa.update(jobs).where(jobs.c.id == by_producer.c.id)
                 .values(fair_round=by_producer.c.turn, fair_key_round=by_producer.c.n))
    conn.execute(sa.update(jobs).where(jobs.c.type == job_type, jobs.c.status == "pending",
                                       jobs.c.run_at > now)
                 .values(fair_round=-1))


def downgrade() -> None:
    # An older release shares every key: of the turns of one (type, key), the oldest job's
    # stays, and the pending jobs whose turn it no longer is wait behind it again.
    conn = op.get_bind()
    turns = conn.execute(sa.select(key_turns.c.type, key_turns.c.concurrency_key,
                                   key_turns.c.job_id, key_turns.c.blocked,
                                   key_turns.c.since)
                         .order_by(key_turns.c.job_id)).all()
    kept: dict[tuple[str, str], tuple[int, int, int]] = {}
    for job_type, key, job_id, blocked, since in turns:
        kept.setdefault((job_type, key), (job_id, blocked, since))
    op.drop_table("key_turns")
    _make_key_turns(with_producer=False)
    rows = [{"type": t, "concurrency_key": k, "job_id": j, "blocked": b, "since": s}
            for (t, k), (j, b, s) in kept.items()]
    old = sa.table("key_turns", sa.column("type"), sa.column("concurrency_key"),
                   sa.column("job_id"), sa.column("blocked"), sa.column("since"))
    for start in range(0, len(rows), 500):
        conn.execute(old.insert(), rows[start:start + 500])
    ordered = sa.select(job_types.c.type).where(job_types.c.ordering == "key")
    conn.execute(sa.update(jobs)
                 .where(jobs.c.type.in_(ordered), jobs.c.concurrency_key.is_not(None),
                        jobs.c.status == "pending",
                        jobs.c.id.not_in(sa.select(old.c.job_id)))
                 .values(status="waiting", fair_round=None))
    op.drop_index("ix_jobs_waiting_producer_key", table_name="jobs")
    op.drop_index("ix_jobs_fair_producer_order", table_name="jobs")
    op.drop_index("ix_jobs_fair_producer_key", table_name="jobs")
    op.drop_index("ix_jobs_fair_order", table_name="jobs")
    op.create_index("ix_jobs_fair_order", "jobs",
                    ["type", sa.text("priority DESC"), "fair_round", "created_at", "id",
                     "run_at"], sqlite_where=FAIR_ROWS, postgresql_where=FAIR_ROWS)
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("fair_key_round")
    with op.batch_alter_table("job_types") as batch:
        batch.drop_column("key_scope")
