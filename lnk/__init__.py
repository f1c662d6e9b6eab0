"""lnk: carry AI agents' state between machines and into and out of cloud buckets."""

__version__ = "0.1.0"
