"""The one SQLAlchemy ``MetaData`` every table of the product is declared on.

Table modules (``schema.py`` for prices, ``ledger_schema``, ``migration_schema``, ``unavailable_schema``,
``jobs_schema``) import only this module; :mod:`costopt.db.schema` imports them all, so importing it
gives the whole schema without an import cycle.
"""

from __future__ import annotations

from sqlalchemy import MetaData

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)
