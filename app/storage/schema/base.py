"""The one MetaData every table is defined on (the code's and Alembic's), its naming
convention, and the column types the tables share."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Integer,
    MetaData,
)

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# SQLite only makes INTEGER PRIMARY KEY an alias of the rowid; PostgreSQL gets a bigint.
Id = BigInteger().with_variant(Integer(), "sqlite")
Micros = BigInteger  # microseconds since the epoch, see app.core.clock
