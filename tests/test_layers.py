"""The folder layout is the architecture; these tests read every module's imports (with ``ast``,
nothing is imported) and hold each layer to its rule:

- ``stations/domain/`` decides: it imports no SQLAlchemy, Alembic, psycopg, HTTP server nor
  ``stations.api``;
- ``stations/api/`` speaks HTTP: no SQLAlchemy, no ``stations.store``;
- ``stations/store/`` speaks SQL below the domain: it imports neither the domain nor
  ``stations.api`` (what both share, a stream's record and the server's errors, lies below
  them in ``stations.records`` and ``stations.errors``, which import nothing of ours);
- ``stations/client/`` (the SDK) speaks HTTP only: nothing server-side;
- the domain runs no SQL either through a connection it was handed: no ``execute``,
  ``exec_driver_sql``, no SQL text;
- only the store's engine code names a database dialect: outside ``stations/store/db.py``,
  ``schema.py`` and the migrations, no code (comments and docstrings aside) says ``sqlite``,
  ``postgresql`` or ``paramstyle`` or asks a ``dialect``;
- no two modules import each other, directly or round a longer circle (imports inside functions
  and under ``TYPE_CHECKING`` count: they are circles all the same).

Every import counts, wherever it is written. There are no exceptions: a module that breaks a
rule fails its test.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "stations"

SERVER_DRIVERS = ("sqlalchemy", "alembic", "psycopg")
# Outside the store's engine code a dialect is never named nor asked for.
ENGINE_CODE = ("stations/store/db.py", "stations/store/schema.py", "stations/store/migrations/")
DIALECT_NAME = re.compile(r"sqlite|postgres|paramstyle|dialect", re.IGNORECASE)
# A string that is a dialect or driver name ("postgresql", "sqlite+pysqlite"), not prose or a
# package extra in a help text; or SQL that only one dialect speaks.
DIALECT_IN_STRING = re.compile(
    r"^[rbf]*['\"](sqlite|postgres|postgresql)(\+\w+)?['\"]$|paramstyle|FOR UPDATE"
)
# Below both the domain and the store: what they share.
SHARED = ("stations.records", "stations.errors")
RUNS_SQL = re.compile(r"^(execute|executemany|exec_driver_sql|scalar_one|scalars)$")
SQL_TEXT = re.compile(r"\b(SELECT|INSERT INTO|UPDATE|DELETE FROM)\b .*\b(FROM|SET|VALUES|WHERE)\b")


def modules() -> dict[str, Path]:
    """Dotted module name → file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = modules()


def imports(name: str, path: Path) -> Iterator[str]:
    """Every module ``name`` imports, anywhere in the file; ``from pkg import mod`` yields
    ``pkg.mod`` when that is a module of ours."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield full if full in MODULES else base


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def import_violations() -> set[tuple[str, str]]:
    found = set()
    for name, path in MODULES.items():
        for target in imports(name, path):
            if under(name, "stations.domain"):
                for lib in (*SERVER_DRIVERS, "aiohttp", "stations.api"):
                    if under(target, lib):
                        found.add((rel(path), f"domain imports {lib}"))
            if under(name, "stations.api"):
                for lib in (*SERVER_DRIVERS, "stations.store"):
                    if under(target, lib):
                        found.add((rel(path), f"api imports {lib}"))
            if under(name, "stations.store"):
                for layer in ("stations.domain", "stations.api"):
                    if under(target, layer):
                        found.add((rel(path), f"store imports {layer}"))
            if name in SHARED and under(target, "stations") and target not in SHARED:
                found.add((rel(path), f"{name} imports {target}"))
            if under(name, "stations.client") and (
                under(target, *SERVER_DRIVERS, "apscheduler")
                or (under(target, "stations") and not under(target, "stations.client"))
            ):
                found.add((rel(path), f"client imports {target}"))
    return found


def docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                lines.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return lines


def code_tokens(path: Path) -> Iterator[tokenize.TokenInfo]:
    """Tokens of the code: comments are not tokens of interest, docstrings are skipped."""
    source = path.read_text()
    skip = docstring_lines(ast.parse(source))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.start[0] not in skip:
            yield tok


def runs_sql(path: Path) -> list[str]:
    return [
        f"{tok.start[0]}: {tok.string}"
        for tok in code_tokens(path)
        if (tok.type == tokenize.NAME and RUNS_SQL.match(tok.string))
        or (tok.type == tokenize.STRING and SQL_TEXT.search(tok.string))
    ]


def sql_violations() -> set[tuple[str, str]]:
    return {
        (rel(path), "domain runs SQL")
        for name, path in MODULES.items()
        if under(name, "stations.domain") and runs_sql(path)
    }


def names_a_dialect(path: Path) -> list[str]:
    """Code (not comments, not docstrings) that names a dialect or asks which one it is."""
    hits = []
    for tok in code_tokens(path):
        pattern = {tokenize.NAME: DIALECT_NAME, tokenize.STRING: DIALECT_IN_STRING}.get(tok.type)
        if pattern is not None and pattern.search(tok.string):
            hits.append(f"{tok.start[0]}: {tok.string}")
    return hits


def dialect_violations() -> set[tuple[str, str]]:
    found = set()
    for path in MODULES.values():
        if rel(path).startswith(ENGINE_CODE):
            continue
        if names_a_dialect(path):
            found.add((rel(path), "names a dialect"))
    return found


def cycles() -> set[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {
        name: {t for t in imports(name, path) if t in MODULES and t != name}
        for name, path in MODULES.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for name in graph:
        if name not in index:
            visit(name)
    return found


def test_the_checks_see_what_they_look_for() -> None:
    """The readers themselves: a module known to import SQLAlchemy is seen doing so, and the
    store's engine code is seen naming dialects (else every other test here passes vacuously)."""
    assert "sqlalchemy" in set(imports("stations.store.db", MODULES["stations.store.db"]))
    assert names_a_dialect(MODULES["stations.store.db"])
    assert runs_sql(MODULES["stations.store.messages"])
    assert "stations.store.db" in set(
        imports("stations.store.database", MODULES["stations.store.database"])
    )
    assert len(MODULES) > 40


def test_layers_import_only_what_they_may() -> None:
    broken = import_violations()
    assert not broken, "\n".join(f"{f}: {rule}" for f, rule in sorted(broken))


def test_only_the_store_engine_code_names_a_dialect() -> None:
    broken = dialect_violations()
    details = [f"{f}: {', '.join(names_a_dialect(ROOT / f))}" for f, _ in sorted(broken)]
    assert not broken, "\n".join(details)


def test_the_domain_runs_no_sql() -> None:
    broken = sql_violations()
    details = [f"{f}: {', '.join(runs_sql(ROOT / f))}" for f, _ in sorted(broken)]
    assert not broken, "\n".join(details)


def test_no_import_circles() -> None:
    broken = cycles()
    assert not broken, "\n".join(" <-> ".join(sorted(c)) for c in broken)
