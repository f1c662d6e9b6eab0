"""A wheel of the running lnk, built by hand, and its install on a box over a leg."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shlex
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

import lnk
from lnk.agents.layout import Machine
from lnk.errors import TransportError
from lnk.transport.legs import Leg


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _package_files() -> list[tuple[str, Path]]:
    root = Path(lnk.__file__).parent
    files = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root.parent).as_posix()
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
            files.append((rel, p))
    return files


def _metadata_text() -> str:
    lines = [
        "Metadata-Version: 2.1",
        "Name: lnk",
        f"Version: {lnk.__version__}",
        "Summary: Carry AI agents' state between machines and into and out of buckets",
    ]
    try:
        meta = metadata.metadata("lnk")
        if meta["Requires-Python"]:
            lines.append(f"Requires-Python: {meta['Requires-Python']}")
        lines += [
            f"Requires-Dist: {r}"
            for r in (meta.get_all("Requires-Dist") or [])
            if "extra ==" not in r
        ]
    except metadata.PackageNotFoundError:
        pass
    return "\n".join(lines) + "\n"


def build_wheel() -> Path:
    """A wheel of the running lnk's own files, cached under ``~/.lnk/cache/wheels/``.

    Built by hand (a zip with dist-info), so it needs neither the source tree
    nor a build tool; keyed by a hash of the files, since a dev build changes
    without a new version.
    """
    files = _package_files()
    meta = _metadata_text()
    key = hashlib.sha256(meta.encode())
    for rel, p in files:
        key.update(rel.encode() + b"\0")
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 16), b""):
                key.update(chunk)
    wheel_name = f"lnk-{lnk.__version__}-py3-none-any.whl"
    out = Machine.current().state_dir / "cache" / "wheels" / key.hexdigest()[:16] / wheel_name
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    dist = f"lnk-{lnk.__version__}.dist-info"
    extra = {
        f"{dist}/METADATA": meta,
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: lnk\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
        f"{dist}/entry_points.txt": "[console_scripts]\nlnk = lnk.cli.main:main\n",
    }
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
    record = []
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as z:
            for rel, p in files:
                h = hashlib.sha256()
                info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                with p.open("rb") as src, z.open(info, "w") as dst:
                    for chunk in iter(lambda: src.read(1 << 16), b""):
                        h.update(chunk)
                        dst.write(chunk)
                record.append(f"{rel},sha256={_b64(h.digest())},{p.stat().st_size}")
            for rel, text in extra.items():
                data = text.encode()
                z.writestr(rel, data)
                record.append(f"{rel},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}")
            record.append(f"{dist}/RECORD,,")
            z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return out


def install_script(wheel_name: str) -> str:
    """The shell line run on the box: wheel on stdin, pip install --user."""
    w = shlex.quote(wheel_name)
    pip = (
        "PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_BREAK_SYSTEM_PACKAGES=1 "
        "python3 -m pip install --user --quiet"
    )
    return (
        'command -v python3 >/dev/null || { echo "python3 is not installed" >&2; exit 90; }; '
        'python3 -m pip --version >/dev/null 2>&1 || { echo "pip is not installed" >&2; exit 91; }; '
        'd=$(mktemp -d "${TMPDIR:-/tmp}/lnk-install.XXXXXX") || exit 92; '
        "trap 'rm -rf \"$d\"' EXIT; "
        f'cat > "$d"/{w} && '
        f'{pip} --force-reinstall --no-deps "$d"/{w} && {pip} "$d"/{w}'
    )


def install_wheel(leg: Leg, wheel: Path) -> None:
    """Send the wheel over the leg (stdin) and install it there for the user."""
    with wheel.open("rb") as f:
        r = leg.run_shell(install_script(wheel.name), stdin=f, check=False)
    if r.returncode == 0:
        return
    err = r.stderr.decode("utf-8", "replace")
    if r.returncode == 255:
        leg.check(r.returncode, err)
    need = {
        90: "install python3 (3.11 or later) on it",
        91: "install pip there (e.g. apt-get install python3-pip)",
    }
    lines = [ln for ln in err.splitlines() if ln.strip()]
    raise TransportError(
        f"installing lnk on {leg.name} failed: {lines[-1] if lines else f'exit {r.returncode}'}",
        hint=need.get(
            r.returncode,
            "run 'python3 -m pip install --user lnk' there by hand, or set LNK_REMOTE_LNK",
        ),
    )
