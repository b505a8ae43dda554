"""A running job's dashboard: its model and its server, started and stopped together by the
driver (``MetricsConfig(ui=True)``; :class:`epochal.runtime.driver.attempts.JobDriver`)."""
from __future__ import annotations

from epochal.ui.model import DashboardModel
from epochal.ui.server import DashboardServer

__all__ = ["Dashboard"]


class Dashboard:
    """Serves ``plan``'s dashboard on ``config.ui_host:ui_port`` with ``config.ui_token``.

    ``source`` and ``latest_progress``: see :class:`~epochal.ui.model.DashboardModel`;
    ``savepoint(stop, timeout, drain) -> url``: the actions (``None``: read-only). The caller feeds
    :attr:`model` every progress event (:meth:`~epochal.ui.model.DashboardModel.on_progress`).

    Raises:
        ConfigError: the address cannot be bound.
    """

    def __init__(self, plan, config, source, latest_progress, savepoint=None):
        self.model = DashboardModel(plan, source, latest_progress)
        self.server = DashboardServer(self.model.view, savepoint, host=config.ui_host, port=config.ui_port,
                                      token=config.ui_token, name=plan.job,
                                      checkpoint=self.model.checkpoint)

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        """Stop serving (idempotent)."""
        self.server.close()
