"""How tests/backup/frozen/v1 was made (kept for the record; not run by tests).

Run once with the lnk of the day on PYTHONPATH:

    HOME=$(mktemp -d) PYTHONPATH=/path/to/lnk python3 make_frozen.py OUTDIR

It backs a small agent up twice (a change between) to OUTDIR/bucket (a local
bucket, labelled lnk-layout=2 beside it), and writes OUTDIR/owner-key.txt (the
test key, `lnk backup key export`) and OUTDIR/expected.json (what a restore of the
newest snapshot must give back).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bk_helpers import agent_files, collections_of, link_groups, sample_agent, write

from lnk.agents.layout import Machine
from lnk.backup import agent_keys
from lnk.backup.agent import backup_agent


def main(out: Path) -> None:
    m = Machine(Path.home())
    a = sample_agent(m, "frozen")
    bucket = out / "bucket"
    bucket.mkdir(parents=True)
    url = f"file://{bucket}"
    first = backup_agent(m, a, url)
    write(a.folders.home / "later.txt", b"added after the first snapshot\n", 0o644)
    second = backup_agent(m, a, url)
    keys = agent_keys.load(m)
    assert keys is not None
    (out / "owner-key.txt").write_text(agent_keys.export_text(keys, True))
    expected = {
        "agent": a.name,
        "id": a.id,
        "snapshots": [first.snapshot, second.snapshot],
        "files": {k: list(v) for k, v in agent_files(a.folders.root).items()},
        "links": sorted(sorted(g) for g in link_groups(a.folders.root)),
        "collections": collections_of(a),
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
