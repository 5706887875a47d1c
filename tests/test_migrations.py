"""The Alembic migrations form one linear chain, numbered in order, that upgrades an empty
database to head and downgrades it to the first release's schema and back on both engines."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from stations.store import db

VERSIONS = Path(db.__file__).resolve().parent / "migrations"


def _config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(VERSIONS))
    config.set_main_option("sqlalchemy.url", url)
    return config


def test_one_linear_chain_numbered_in_order() -> None:
    script = ScriptDirectory.from_config(_config("sqlite://"))
    assert len(script.get_heads()) == 1, script.get_heads()
    chain = list(reversed(list(script.walk_revisions())))
    revisions = [r.revision for r in chain]
    assert revisions == [f"{n:04d}" for n in range(1, len(revisions) + 1)], revisions
    for r in chain:
        assert Path(r.path).name.startswith(r.revision + "_"), r.path


def test_downgrade_and_upgrade_again(db_url: str) -> None:
    engine = db.make_engine(db_url, writer=True)
    try:
        db.upgrade(engine)
        url = engine.url.render_as_string(hide_password=False)
        command.downgrade(_config(url), "0005")
        command.upgrade(_config(url), "head")
        db.upgrade(engine)  # and the server's own upgrade finds nothing to do
    finally:
        engine.dispose()
