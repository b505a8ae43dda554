"""Errors raised by epochal. Every message names what was wrong and where."""


class EpochalError(Exception):
    """Base class of all errors raised by epochal."""


class PipelineDefinitionError(EpochalError, ValueError):
    """The dataflow graph is invalid; raised while the graph is built, never during a run."""


class ConfigError(EpochalError, ValueError):
    """A run option is invalid; the message names the option (config key)."""


class OperatorError(EpochalError):
    """A user function raised while processing a record.

    Carries the operator name, the physical task and a repr of the record so the job's
    final error says exactly where processing failed.
    """

    def __init__(self, operator: str, task: str, record_repr: str, cause: str):
        self.operator = operator
        self.task = task
        self.record_repr = record_repr
        self.cause = cause
        super().__init__(
            f"operator {operator!r} (task {task}) failed on record {record_repr}: {cause}"
        )

    def __reduce__(self):
        return (OperatorError, (self.operator, self.task, self.record_repr, self.cause))


class DataError(EpochalError):
    """Input the job cannot process, the same way on every attempt: a text file that is not
    UTF-8, a line longer than the source's limit, a record that cannot be encoded for the
    wire. Retrying cannot help, so the job fails at once; the message names the source or
    operator, where in the input, and what to do."""


class CheckpointStorageError(EpochalError):
    """Checkpoint storage could not be read or written (or a checksum did not match)."""


class JobFailedError(EpochalError):
    """The job failed and the restart strategy gave up; ``causes`` lists every attempt's cause."""

    def __init__(self, message: str, causes: list[str] | None = None):
        self.causes = list(causes or [])
        super().__init__(message)

    def __reduce__(self):
        return (JobFailedError, (self.args[0], self.causes))


class InjectedFault(EpochalError):
    """Raised by :mod:`epochal.testing` fault injection; never raised in production runs."""


class TaskStartError(EpochalError):
    """A task cannot join its attempt because it cannot reach the coordinator.

    Nothing can report for such a task, so it fails the launcher's task at once (on Spark,
    the barrier stage), and the message — naming the task, its host and the address — is
    the attempt's cause. Never a silent wait for the start-up timeout.
    """


class ChannelSetupError(EpochalError):
    """A task cannot bind its data server or connect to a peer task; the message names the
    task, its host and the address."""


class SavepointError(EpochalError):
    """A savepoint could not be taken (its epoch was aborted, the job failed or finished
    first, or the copy failed); the message says which. The job keeps running."""
