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
import traceback
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

    def __init__(self, message: str, code: int = EXIT_USAGE, log: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.log = log  # Spark's log, kept for a failure whose cause it holds


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
    return os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def _say_python(master: str, python: str) -> None:
    """On a cluster, which interpreter the workers run (said once Spark started: a master
    that does not start is one error line, not two)."""
    if not master.startswith("local"):
        print(
            f"stations pipeline: Spark's Python workers run {python} (PYSPARK_PYTHON); every "
            "worker host needs it with stations, orjson and pyarrow",
            file=sys.stderr,
        )


@contextmanager
def spark_session(
    app: str, master: str, conf_items: list[str], *, verbose: bool = False
) -> Iterator[SparkSession]:
    """A SparkSession for one job. Spark's own output (the JVM's start-up lines, log4j's
    warnings and errors with their Java traces, the Python workers' tracebacks) goes to a log
    file, not the terminal: a failure is said in one line, and one whose cause is not known
    names that file, kept for it. ``verbose`` leaves it all on stderr, as Spark has it."""
    from pyspark.sql import SparkSession

    confs = parse_confs(conf_items)
    python = python_for_workers(master)
    confs.setdefault("spark.pyspark.python", python)
    confs.setdefault("spark.pyspark.driver.python", python)
    logdir = tempfile.mkdtemp(prefix="stations-pipeline-log-")
    log = None if verbose else os.path.join(logdir, "spark.log")
    if "spark.driver.extraJavaOptions" not in confs:  # warnings and errors, not INFO chatter
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
    keep = False
    try:
        try:
            with _stderr_to(log):  # the JVM (and the workers it starts) keep this stderr
                session = builder.getOrCreate()
        except Exception as exc:  # no Java, a bad --master or --conf, ...: in one line
            keep = log is not None
            raise PipelineError(_not_started(master, exc, log)) from None
        session.sparkContext.setLogLevel("WARN")
        _say_python(master, python)
        try:
            with spark_failures(log, verbose):
                yield session
        except PipelineError as exc:
            keep = exc.log is not None
            raise
        finally:
            session.stop()
    finally:
        if not keep:
            shutil.rmtree(logdir, ignore_errors=True)


@contextmanager
def _stderr_to(path: str | None) -> Iterator[None]:
    """File descriptor 2 pointed at ``path`` for the duration (as processes started meanwhile
    inherit it)."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


# What Spark's launcher says when it refuses to start (a bad master, a bad --conf value).
_LAUNCHER = re.compile(r'^(?:Exception in thread "main" [\w.$]+: |Error: )(.+)$', re.MULTILINE)


def _not_started(master: str, exc: BaseException, log: str | None) -> str:
    said = ""
    if log is not None and os.path.exists(log):
        found = _LAUNCHER.findall(Path(log).read_text(errors="replace"))
        said = found[0].strip() if found else ""
    words = said or " ".join(str(exc).split())[:300] or type(exc).__name__
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        fix = "it needs Java 17 or newer (java on the PATH, or JAVA_HOME)"
    else:  # with Java there, a bad --master was blamed on Java all the same
        fix = "check --master (local, local[N], spark://HOST:PORT, yarn, k8s://...) and --conf"
    where = f" (Spark's log: {log})" if log is not None else ""
    return f"Spark did not start (master {master}): {words}; {fix}{where}"


_LOG4J2 = """\
rootLogger.level = warn
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


# The last line of a Python traceback: the exception and its message.
_RAISED = re.compile(r"^(?:[A-Za-z_][\w.]*)(?:Error|Exception|Exit|Failed|Fenced)\w*: .+$")


def cause_of(exc: BaseException) -> str:
    """A Spark or Py4J failure's cause in one line: the Java exception and its message, or the
    last line of a Python worker's traceback (not the pages of Java frames around them)."""
    java = getattr(exc, "java_exception", None)  # Py4JJavaError
    if java is not None:
        try:
            return " ".join(str(java.toString()).split())[:400]
        except Exception:  # the JVM is gone: fall back to the text
            pass
    text = str(exc).split("JVM stacktrace:")[0]
    lines = [line.strip() for line in text.splitlines()]
    if "Traceback (most recent call last)" in text:
        raised = [line for line in lines if _RAISED.match(line)]
        if raised:
            return raised[-1][:400]
    for line in lines:
        line = line.lstrip(": ").strip()
        if line and not line.startswith(("at ", "An error occurred while calling")):
            return line[:400]
    return type(exc).__name__


def is_spark_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is Spark's (a captured JVM or Python worker error) or Py4J's."""
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    return isinstance(exc, (Py4JError, PySparkException))


@contextmanager
def spark_failures(log: str | None, verbose: bool) -> Iterator[None]:
    """Spark's failures of unknown cause as a ``PipelineError`` of one line (exit code 2, as
    the command's help says for anything else) naming Spark's log when there is one;
    ``verbose`` lets them through with their tracebacks."""
    try:
        yield
    except PipelineError:
        raise
    except Exception as exc:
        if verbose or not is_spark_failure(exc):
            raise  # ours: a bug's traceback stays
        where = ""
        if log is not None:  # raised to the driver, the failure is in no log of Spark's
            with open(log, "a", errors="replace") as f:
                f.write("".join(traceback.format_exception(exc)))
            where = f" (Spark's log: {log})"
        raise PipelineError(f"the Spark job failed: {cause_of(exc)}{where}", log=log) from None
