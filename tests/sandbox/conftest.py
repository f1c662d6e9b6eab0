"""The runner fixture shared with the other suites that start agents."""

from tests.agent_runner import Running, start_agent

__all__ = ["Running", "start_agent"]
