"""lnk-hermes: lnk's adapter for Hermes Agent, through the adapter contract (version 1).

See lnk's docs/adapters.md.  This package imports nothing of lnk: it is an adapter like
anyone's, speaking the contract's JSON and the endpoint protocol on its own.
"""

ADAPTER_RELEASE = "0.1.0"
HARNESS = "hermes-agent"
HARNESS_RELEASE = "0.19.0"
CONTRACT = 1
