"""The store's ledger: one line per committed record, hash-chained, keyed where the operator gives a key.

Unkeyed, the chain detects damage, not forgery: whoever can write the store can rewrite it. With a
key outside the store (`$CKO_LEDGER_KEY_FILE`, or `ledger_key_file` in the system policy) every line
carries `seq` and `mac` = HMAC-SHA256(key, the line without its mac); `prev` chains the previous
line's bytes. A forged, edited, reordered or removed line then fails `verify`. Removing the newest
lines (with their records) is only detected against a head kept outside the store: after each
append cko writes `<head dir>/<store hash>.json` = {seq, line sha256, mac}; verify refuses a ledger
shorter than its head. The head dir is `ledger_head_dir` in the system policy, else
`$CKO_LEDGER_HEAD_DIR`, else `heads/` beside the key file. It detects truncation only as long as
whoever edits the store cannot also write there.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .canonical import sha256_bytes
from .errors import CkoError, Exit, unavailable

if TYPE_CHECKING:
    from .store import Store

GENESIS = "0" * 64


def _line_bytes(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def key_source() -> tuple[str | None, str | None]:
    """(key file, head dir) from the environment or the system policy; (None, None): unkeyed."""
    from .policy import load_system

    env_key = os.environ.get("CKO_LEDGER_KEY_FILE")
    system, _, _ = load_system()
    key_file = env_key or system.ledger_key_file
    if not key_file:
        return None, None
    head_dir = (
        system.ledger_head_dir
        or os.environ.get("CKO_LEDGER_HEAD_DIR")
        or str(Path(key_file).parent / "heads")
    )
    return key_file, head_dir


def load_key() -> tuple[bytes | None, Path | None]:
    key_file, head_dir = key_source()
    if key_file is None:
        return None, None
    try:
        fd = os.open(key_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise unavailable(
            f"ledger key {key_file}: {exc.strerror}", code="ledger_key_unreadable", field="ledger_key_file"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o022:
            raise unavailable(
                f"ledger key {key_file} must be a regular file no one else may write",
                code="ledger_key_unsafe",
                field="ledger_key_file",
            )
        key = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(key) < 16:
        raise unavailable(
            f"ledger key {key_file} is shorter than 16 bytes",
            code="ledger_key_unsafe",
            field="ledger_key_file",
        )
    return key, Path(head_dir) if head_dir else None


def mac(key: bytes, doc: dict[str, Any]) -> str:
    body = {k: v for k, v in doc.items() if k != "mac"}
    return hmac.new(key, _line_bytes(body), hashlib.sha256).hexdigest()


def head_path(head_dir: Path, store: Store) -> Path:
    return head_dir / (hashlib.sha256(str(store.root).encode()).hexdigest()[:32] + ".json")


def head_mac(key: bytes, store: Store, seq: int, line_sha: str) -> str:
    return hmac.new(key, f"{store.root}|{seq}|{line_sha}".encode(), hashlib.sha256).hexdigest()


def _last_line(data: bytes) -> tuple[bytes | None, int]:
    """The last complete line and the length of the committed part (a partial tail excluded)."""
    end = data.rfind(b"\n") + 1  # 0 when no complete line
    if end == 0:
        return None, 0
    start = data.rfind(b"\n", 0, end - 1) + 1
    return data[start : end - 1], end


def append(store: Store, rel: str, digest: str) -> None:
    """Append one line (caller holds the ledger lock); all or nothing even on a full disk."""
    from .store import write_replace

    key, head_dir = load_key()
    path = store.ledger_path
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        data = b""
        size = os.fstat(fd).st_size
        if size:
            os.lseek(fd, 0, os.SEEK_SET)
            data = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
        last, committed = _last_line(data)
        if committed != len(data):  # a partial line from a crash: never committed, dropped
            os.ftruncate(fd, committed)
        prev = sha256_bytes(last) if last is not None else GENESIS
        doc: dict[str, Any] = {"path": rel, "sha256": digest, "prev": prev}
        if key is not None:
            seq = (json.loads(last).get("seq", 0) if last is not None else 0) + 1
            doc["seq"] = seq
            doc["mac"] = mac(key, doc)
        line = _line_bytes(doc)
        try:
            os.lseek(fd, committed, os.SEEK_SET)
            view = memoryview(line + b"\n")
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError as exc:
            os.ftruncate(fd, committed)
            raise CkoError(
                f"the ledger could not be written ({exc.strerror}); the record was not committed",
                exit_code=Exit.FAILED,
                code="store_write_failed",
                field="store",
            ) from None
    finally:
        os.close(fd)
    if key is not None and head_dir is not None:
        head_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        ls = sha256_bytes(line)
        write_replace(
            head_path(head_dir, store),
            _line_bytes({"seq": doc["seq"], "line_sha256": ls, "mac": head_mac(key, store, doc["seq"], ls)}),
        )


def verify_keyed(store: Store, lines: list[bytes]) -> list[str]:
    """Problems a key finds: unkeyed or forged lines, a broken sequence, a ledger behind its head."""
    key, head_dir = load_key()
    if key is None:
        return []
    problems = []
    for n, raw in enumerate(lines, start=1):
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if "mac" not in doc:
            problems.append(f"line {n} carries no key (written without the ledger key, or forged)")
        elif not hmac.compare_digest(str(doc["mac"]), mac(key, doc)):
            problems.append(f"line {n} fails its key (forged or edited)")
        elif doc.get("seq") != n:
            problems.append(f"line {n} has seq {doc.get('seq')} (lines reordered or removed)")
    if head_dir is not None:
        hp = head_path(head_dir, store)
        if hp.exists():
            problems += _check_head(key, store, hp, lines)
    return problems


def _check_head(key: bytes, store: Store, hp: Path, lines: list[bytes]) -> list[str]:
    try:
        head = json.loads(hp.read_bytes())
        seq, ls = int(head["seq"]), str(head["line_sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return [f"the ledger head {hp} is unreadable"]
    if not hmac.compare_digest(str(head.get("mac")), head_mac(key, store, seq, ls)):
        return [f"the ledger head {hp} fails its key"]
    if len(lines) < seq:
        return [f"the ledger has {len(lines)} lines but its head says {seq}: the newest records were removed"]
    if sha256_bytes(lines[seq - 1]) != ls:
        return [f"ledger line {seq} is not the line the head recorded"]
    return []
