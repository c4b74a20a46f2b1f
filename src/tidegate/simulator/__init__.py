"""The simulated provider: an OpenAI-compatible upstream with configurable latency, errors, 429s
and rate limits, which the demo, the tests and the benchmarks call instead of a real one. A
development and test tool, not part of the request path."""

from tidegate.simulator.server import InjectedFault, Simulator
from tidegate.simulator.settings import ModelBehaviour, SimulatorSettings

__all__ = ["InjectedFault", "ModelBehaviour", "Simulator", "SimulatorSettings"]
