"""The SparkSession a pipeline job runs on, for any master, and Spark's failures as one line.

Spark starts Python workers on the driver (Python data sources are planned there) and on every
executor with the interpreter in ``PYSPARK_PYTHON``, fixed when the SparkContext starts; a
``--conf spark.pyspark.python`` comes too late for the driver side. So the pipeline exports its
own interpreter as ``PYSPARK_PYTHON`` (unless the user set one) for every master, and says so
for a cluster, where each worker host must have that interpreter with the executor requirements.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from stations.commands.base import (
    EXIT_USAGE,
    exit_code,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")


class PipelineError(Exception):
    """A problem to report in one line, and the exit status it ends the command with: the
    management commands' codes (``stations --help``), 2 for a usage or set-up problem."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def failure(message: str, exc: BaseException) -> PipelineError:
    """A ``PipelineError`` for an SDK error, with the exit code the management commands give
    it (the server unreachable 6, a token refused 5, not found 3, ...)."""
    return PipelineError(message, exit_code(exc))


def _code_of(name: str) -> int:
    """The exit code of the SDK error a Spark task's traceback ended with, by its class name:
    the management commands' code for that class (its status says it)."""
    from stations.client import errors

    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.StationsError)):
        return EXIT_USAGE
    return exit_code(cls.__new__(cls))  # the class's status, as an answer would carry it


def parse_confs(items: list[str]) -> dict[str, str]:
    confs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise PipelineError(f"--conf takes KEY=VALUE (got {item!r})")
        confs[key] = value
    return confs


def python_for_workers(master: str) -> str:
    """Export this interpreter for Spark's Python workers (unless ``PYSPARK_PYTHON`` is set);
    returns the one in use."""
    python = os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not master.startswith("local"):
        print(
            f"stations pipeline: Spark's Python workers run {python} (PYSPARK_PYTHON); every "
            "worker host needs it with stations, orjson and pyarrow",
            file=sys.stderr,
        )
    return python


@contextmanager
def spark_session(app: str, master: str, conf_items: list[str]) -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    confs = parse_confs(conf_items)
    python = python_for_workers(master)
    confs.setdefault("spark.pyspark.python", python)
    confs.setdefault("spark.pyspark.driver.python", python)
    logdir = tempfile.mkdtemp(prefix="stations-pipeline-log-")
    if "spark.driver.extraJavaOptions" not in confs:  # errors only, not Spark's start-up chatter
        config = os.path.join(logdir, "log4j2.properties")
        Path(config).write_text(_LOG4J2)
        confs["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{config}"
    builder = (
        SparkSession.builder.appName(app)
        .master(master)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.enabled", "false")
    )
    for key, value in confs.items():
        builder = builder.config(key, value)
    try:
        try:
            session = builder.getOrCreate()
        except Exception as exc:  # no Java, a bad --master, ...: Spark's own words, in one line
            words = " ".join(str(exc).split())[:300] or type(exc).__name__
            # With Java there, a bad --master was blamed on Java all the same.
            fix = (
                "check --master (local, local[N], spark://HOST:PORT, yarn, k8s://...) and "
                "Spark's own message above"
                if os.environ.get("JAVA_HOME") or shutil.which("java")
                else "it needs Java 17 or newer (java on the PATH, or JAVA_HOME)"
            )
            raise PipelineError(f"Spark did not start (master {master}): {words}; {fix}") from None
        session.sparkContext.setLogLevel("ERROR")
        try:
            yield session
        finally:
            session.stop()
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
"""

# The last line of a Python traceback that Spark wraps into its own exception's text.
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
_SDK_ERROR = re.compile(r"^stations\.client\.errors\.(\w+): (.+)$", re.MULTILINE)
_VALUE_ERROR = re.compile(r"^ValueError: (.+)$", re.MULTILINE)


def one_line(text: str, url: str) -> str | None:
    """The cause of a failed Spark job in one line with its fix, when it is one we know."""
    missing = _MISSING_MODULE.search(text)
    if missing:
        module = missing.group(1).split(".")[0]
        python = os.environ.get("PYSPARK_PYTHON", sys.executable)
        return (
            f"a Spark Python worker cannot import {module!r}: install the executor requirements "
            f"(this package with its spark extra, from its wheel or checkout: pip install "
            f"'/path/to/stations[spark]'; stations, orjson, pyarrow) for {python} on every "
            "worker host, or point PYSPARK_PYTHON at an interpreter that has them"
        )
    errors = _SDK_ERROR.findall(text)
    if errors:
        name, message = errors[-1]
        if name == "ConnectionFailed":
            return (
                f"Spark executors cannot reach the Stations server at {url} ({message}): if it "
                "stopped answering during the job, run the job again once it is back (with "
                "message ids, what was stored is not stored twice); else give a --url every "
                "executor can reach (not 127.0.0.1 when executors run elsewhere)"
            )
        return str(message)
    values = _VALUE_ERROR.findall(text)
    return str(values[-1]) if values else None


def run_spark(job: Callable[[], T], url: str) -> T:
    """``job()``, with Spark's long failures turned into a ``PipelineError`` when known."""
    try:
        return job()
    except PipelineError:
        raise
    except Exception as exc:
        text = str(exc)
        line = one_line(text, url)
        if line is not None:
            errors = _SDK_ERROR.findall(text)
            code = _code_of(errors[-1][0]) if errors else EXIT_USAGE
            raise PipelineError(line, code) from None
        raise
