"""An agent's connections and schedules, carried by its bridge (docs/connections.md).

One bridge per agent (``python -m lnk.connections.bridge AGENT_ID``), outside its
sandbox, started and stopped by the agent's runner: it polls Telegram, fires the
agent's jobs, and hands each message to the agent's endpoint as ``lnk agent chat
send`` does.  Its state lives in ``Agent/connections/`` so a move's final phase
carries it; the move's epoch and hold fence any copy that should act no more.
"""
