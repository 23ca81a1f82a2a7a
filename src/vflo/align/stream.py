"""Private set intersection of two parties' files in bounded memory: IDs streamed from disk into buckets, the
buckets intersected one at a time by vflo's ECDH (:mod:`vflo.align.psi`), the result written as a file each party
keeps.

Both parties read their ID column a batch of rows at a time (Parquet by row groups, CSV by blocks; IDs as text,
as :func:`vflo.data.files.read_table` reads them) and spill each ID, with its row's position in the file, to one
of ``B`` bucket files on their own disk: the bucket of an ID is a hash of it under a salt the active party draws
for the run, so the same person lands in the same bucket at both. ``B`` is chosen from the larger party's row
count and the memory ceiling (``memory_mb``), so that one bucket's work fits under it; each bucket is then one
ordinary ECDH intersection of its IDs, under keys each party keeps for the whole run:

1. ``align.stream_open`` (purpose, mode): the partner counts its rows and answers how many.
2. ``align.stream_split`` (salt, number of buckets): the partner spills its IDs into its buckets.
3. ``align.stream_bucket`` (bucket, A's blinded IDs) for each bucket: the partner answers them blinded again and
   its own bucket's IDs blinded, shuffled; with ``mode = 'both'`` the next message carries which of them matched
   (``matched``, for the bucket before).
4. ``align.stream_close`` (token, the last bucket's matches): the partner writes its file and answers its count.

Each side sends every bucket as its largest one, the rest filled with random points, which blinded cannot be told
from real ones: both know the salt, so a bucket's true count would tell the other which of the IDs it could
guess hash there (a small party's empty buckets, say, rule out every ID that lands in them). What each side
learns beyond a whole-file ECDH intersection: the other's row count and its largest bucket's count.

Each party keeps, in its alignments folder, ``streamed/PEER.PURPOSE.TOKEN.parquet``: every row of its own file,
by position (``row``), flagged ``shared`` or not (the rows outside the intersection kept, flagged), and a
``.json`` beside it (token, peer, purpose, mode, file, its size and time, row and shared counts, buckets, memory
ceiling). Neither holds the other party's IDs. A partner with ``mode = 'active'`` learns no flags and writes only
the ``.json``. Both are written under a temporary name and renamed: a record is whole or absent.

What stays in memory whatever the number of IDs: one bucket's IDs and points at each party, and one flag per row
(a byte: 10 MB at ten million rows).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vflo.align import psi
from vflo.align.ids import IdFile, check_unique
from vflo.align.kept import now, store_of
from vflo.comm.message import INT, STR, ArraySpec, Fields, FieldSpec, Payload, check_payload
from vflo.data.files import SUFFIXES, file_format
from vflo.errors import ConfigError, DataError, DataFileError, ProtocolError
from vflo.private import private_folder

if TYPE_CHECKING:
    from vflo.party.context import NodeContext
    from vflo.party.port import Aligning

logger = logging.getLogger(__name__)

OPEN_KIND, SPLIT_KIND, BUCKET_KIND, CLOSE_KIND = ("align.stream_open", "align.stream_split", "align.stream_bucket",
                                                  "align.stream_close")
MATCHED = ArraySpec(("bool",), (None,))
OPEN: dict[str, FieldSpec] = {"purpose": STR, "mode": STR}
OPENED: dict[str, FieldSpec] = {"rows": INT}
SPLIT: dict[str, FieldSpec] = {"salt": ArraySpec(("uint8",), (32,)), "buckets": INT}
SPLITTED: dict[str, FieldSpec] = {"rows": INT}
BUCKET: dict[str, FieldSpec] = {"bucket": INT, "points": psi.POINTS, "matched": MATCHED}
BUCKETED: dict[str, FieldSpec] = {"double": psi.POINTS, "points": psi.POINTS}
CLOSE: dict[str, FieldSpec] = {"token": STR, "matched": MATCHED}
CLOSED: dict[str, FieldSpec] = {"count": INT}

#: Bytes one ID of a bucket costs the process that runs both sides of its intersection (its text, its point, the
#: points blinded and matched): what tracemalloc traces per ID, rounded well up; tests/test_stream_psi.py checks
#: that a streamed intersection sized by it stays under its ceiling.
BYTES_PER_ID = 800
#: The fewest bytes a ceiling may give: below it, the bookkeeping alone would not fit.
MIN_MEMORY_MB = 1
#: The most buckets a partner spills into (a billion IDs under 8 MB each).
MAX_BUCKETS = 100_000


def _columns(source: IdFile, batch_rows: int) -> Iterator[Any]:
    """The ID column a batch at a time, as Arrow text arrays (a CSV file by blocks of about ``batch_rows`` rows)."""
    path = source.path
    if not path.is_file():
        raise DataFileError(f"the ID file {path} does not exist")
    kind = file_format(path)
    import pyarrow as pa

    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            parquet = pq.ParquetFile(path)
            if source.id_column not in parquet.schema_arrow.names:
                raise DataError(f"{path}: no ID column {source.id_column!r} (its columns: "
                                f"{parquet.schema_arrow.names[:12]}); name the column that holds the IDs")
            batches: Iterator[Any] = parquet.iter_batches(batch_size=batch_rows, columns=[source.id_column])
        elif kind:
            import pyarrow.csv as pcsv

            # Blocks of about a batch's bytes; IDs as text, as read_table reads them ("007" stays "007").
            batches = iter(pcsv.open_csv(
                path, read_options=pcsv.ReadOptions(block_size=max(1 << 16, batch_rows * 32)),
                parse_options=pcsv.ParseOptions(delimiter=kind, newlines_in_values=True),
                # An empty or "NA" ID is a row without one, as read_table reads it.
                convert_options=pcsv.ConvertOptions(include_columns=[source.id_column], strings_can_be_null=True,
                                                    column_types={source.id_column: pa.string()})))
        else:
            raise DataFileError(f"cannot tell the format of {path.name}; use a {SUFFIXES} file")
        for batch in batches:
            column = batch.column(0)
            if column.null_count:
                raise DataError(f"{path}: {column.null_count} rows without an ID in column {source.id_column!r}; "
                                "give every row its ID, or drop those rows")
            yield column.cast(pa.string())
    except (pa.ArrowInvalid, KeyError) as exc:
        raise DataError(f"{path}: could not read ID column {source.id_column!r}: {exc}") from exc


def _reader(source: IdFile, batch_rows: int) -> Iterator[list[str]]:
    """The IDs a batch at a time, tagged as text (:func:`vflo.align.ids.tagged` of a file's IDs)."""
    for column in _columns(source, batch_rows):
        yield ["s:" + v for v in column.to_pylist()]


def count_rows(source: IdFile, *, batch_rows: int = 4_096) -> int:
    """Rows of an ID file (from a Parquet file's footer; a CSV file is read through, its IDs checked present)."""
    if file_format(source.path) == "parquet" and source.path.is_file():
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(source.path).metadata.num_rows)
    return sum(len(column) for column in _columns(source, batch_rows))


def buckets_for(rows: int, memory_mb: float) -> int:
    """How many buckets keep one bucket of ``rows`` IDs under ``memory_mb``."""
    if memory_mb < MIN_MEMORY_MB:
        raise ConfigError(f"a memory ceiling of {memory_mb} MB is too small for streaming PSI: give at least "
                          f"{MIN_MEMORY_MB} MB")
    buckets = max(1, math.ceil(rows * BYTES_PER_ID / (memory_mb * 2**20)))
    if buckets > MAX_BUCKETS:
        raise ConfigError(f"{rows:,} IDs under {memory_mb} MB would need {buckets:,} buckets, more than "
                          f"{MAX_BUCKETS:,}: give a larger --memory-mb")
    return buckets


def batch_rows_for(memory_mb: float) -> int:
    """Rows read at a time: a quarter of the ceiling's worth of IDs, within 1,024 to 65,536."""
    return int(min(65_536, max(1_024, memory_mb * 2**20 / 4 / BYTES_PER_ID)))


def bucket_of(names: list[str], salt: bytes, n_buckets: int) -> np.ndarray:
    """Each ID's bucket: a hash under the run's salt (the same person, the same bucket, at both parties)."""
    return np.array([int.from_bytes(hashlib.sha256(b"bucket" + salt + n.encode()).digest()[:8], "little") % n_buckets
                     for n in names], dtype=np.int64)


class Spill:
    """A party's IDs spilled into bucket files in a folder of its own (removed by :meth:`close`): for each
    bucket, its rows' positions (int64), their IDs' lengths (int32) and the IDs (UTF-8, one after another)."""

    def __init__(self, source: IdFile, salt: bytes, n_buckets: int, *, batch_rows: int,
                 parent: Path | None = None) -> None:
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix=".stream-", dir=parent))
        # Removed when closed, and otherwise when dropped or when the process ends: an asker that never closes
        # leaves nothing behind at the partner.
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.folder), True)
        self.n_buckets = n_buckets
        self.rows = 0
        self.counts = np.zeros(n_buckets, dtype=np.int64)  # IDs per bucket
        try:
            for names in _reader(source, batch_rows):
                self._add(names, bucket_of(names, salt, n_buckets))
        except BaseException:
            self.close()
            raise

    def _add(self, names: list[str], buckets: np.ndarray) -> None:
        order = np.argsort(buckets, kind="stable")
        present, starts = np.unique(buckets[order], return_index=True)
        ends = [*starts[1:].tolist(), len(order)]
        encoded = [n.encode() for n in names]
        for k, a, b in zip(present.tolist(), starts.tolist(), ends, strict=True):
            self.counts[k] += b - a
            rows = order[a:b]
            chunk = [encoded[i] for i in rows.tolist()]
            with (self.folder / f"{k}.pos").open("ab") as f:
                f.write((rows + self.rows).astype(np.int64).tobytes())
            with (self.folder / f"{k}.len").open("ab") as f:
                f.write(np.array([len(c) for c in chunk], dtype=np.int32).tobytes())
            with (self.folder / f"{k}.ids").open("ab") as f:
                f.write(b"".join(chunk))
        self.rows += len(names)

    def bucket(self, k: int) -> tuple[np.ndarray, list[str]]:
        """Bucket ``k``'s rows (their positions in the file) and IDs, checked unique."""
        if not (self.folder / f"{k}.pos").is_file():
            return np.empty(0, dtype=np.int64), []
        positions = np.fromfile(self.folder / f"{k}.pos", dtype=np.int64)
        lengths = np.fromfile(self.folder / f"{k}.len", dtype=np.int32)
        data = (self.folder / f"{k}.ids").read_bytes()
        ends = np.cumsum(lengths).tolist()
        names = [data[a:b].decode() for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        check_unique(names)  # a repeated ID lands in one bucket: the whole file's check, a bucket at a time
        return positions, names

    @property
    def padded(self) -> int:
        """The points each of this party's buckets is sent as: its largest bucket's count."""
        return int(self.counts.max(initial=0))

    def close(self) -> None:
        self._finalizer()


def padded(points: np.ndarray, size: int) -> np.ndarray:
    """``points`` followed by random ones up to ``size``: blinded, the two cannot be told apart, and a random point
    matches nothing (a chance of about 2^-250 for each pair)."""
    extra = size - len(points)
    if extra <= 0:
        return points
    return np.concatenate([points, np.frombuffer(secrets.token_bytes(32 * extra), dtype=np.uint8).reshape(extra, 32)])


@dataclass(frozen=True)
class Streamed:
    """One streamed intersection as a party recorded it (the ``.json`` beside its flags)."""

    token: str
    party: str
    peer: str
    side: str  # "asker" or "partner"
    purpose: str
    mode: str
    file: str
    file_bytes: int
    file_modified: float
    rows: int
    shared: int  # -1: a partner with mode 'active'
    buckets: int
    memory_mb: float
    created: str

    @property
    def stem(self) -> str:
        return f"{self.peer}.{self.purpose}.{self.token}"


def write_record(folder: Path, record: Streamed, shared: np.ndarray | None) -> Path:
    """The record's flags (a Parquet file, written a slice at a time) and its ``.json``, each renamed into place
    once whole. The path of the ``.json``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = private_folder(folder / "streamed")
    if shared is not None:
        part = out / f".{record.stem}.parquet.part"
        schema = pa.schema([("row", pa.int64()), ("shared", pa.bool_())])
        with pq.ParquetWriter(part, schema) as writer:
            for start in range(0, len(shared), 1 << 20):
                flags = shared[start:start + (1 << 20)]
                writer.write_table(pa.table({"row": np.arange(start, start + len(flags), dtype=np.int64),
                                             "shared": flags}, schema=schema))
        part.replace(out / f"{record.stem}.parquet")
    meta = out / f".{record.stem}.json.part"
    meta.write_text(json.dumps(asdict(record), indent=1))
    meta.replace(out / f"{record.stem}.json")
    return out / f"{record.stem}.json"


def read_record(path: Path) -> tuple[Streamed, np.ndarray | None]:
    """A record written by :func:`write_record` (its ``.json``) and its flags, in row order (None where the
    party learned none)."""
    record = Streamed(**json.loads(Path(path).read_text()))
    table = Path(path).with_suffix(".parquet")
    if not table.is_file():
        return record, None
    import pyarrow.parquet as pq

    shared = pq.read_table(table, columns=["shared"]).column(0).to_numpy(zero_copy_only=False)
    return record, np.asarray(shared, dtype=bool)


def _file_facts(source: IdFile) -> tuple[str, int, float]:
    stat = source.path.stat()
    return str(source.path.resolve()), int(stat.st_size), float(stat.st_mtime)


@dataclass
class StreamPart:
    """A partner's side of a streamed intersection, between its messages: who asked, for which rows and mode,
    its key, its buckets, the flags it has learned and the bucket it answered last (its shuffled positions)."""

    source: tuple[str, str, str] | None = None  # (sender, purpose, mode)
    file: IdFile | None = None
    rows: int = 0
    key: bytes = b""
    salt: bytes = b""
    spill: Spill | None = None
    shared: np.ndarray | None = None
    last: tuple[int, np.ndarray] | None = None  # (bucket, its rows in the order sent)
    done: set[int] = field(default_factory=set)
    memory_mb: float = 0.0

    def reset(self) -> None:
        if self.spill is not None:
            self.spill.close()
        self.__init__()  # type: ignore[misc]  # every field back to its start; mypy refuses __init__ on an instance


def _id_file(ctx: NodeContext, purpose: str) -> IdFile:
    store = store_of(ctx)
    files = store.files if store is not None else {}
    if store is None or purpose not in files:
        raise ConfigError(f"party {ctx.party!r} streams no {purpose!r} IDs: streaming PSI reads the party's own "
                          f"file ([data] {'file' if purpose == 'train' else 'serve_file'} in its config) and keeps "
                          "its result in its alignments folder (alignments in its config)")
    source: IdFile = files[purpose]
    return source


def _apply(part: StreamPart, matched: np.ndarray) -> None:
    """The flags of the bucket the partner answered last, learned from the asker (mode 'both')."""
    if part.last is None:
        if len(matched):
            raise ProtocolError("matches sent for no bucket this party answered")
        return
    _, positions = part.last
    assert part.spill is not None and part.shared is not None
    if matched.shape != (part.spill.padded,):
        raise ProtocolError(f"{len(matched)} matches for the {part.spill.padded} points of the bucket answered last")
    part.shared[positions[matched[:len(positions)]]] = True


def handle_open(ctx: NodeContext, payload: Fields) -> Payload:
    """A partner: start a streamed intersection with the sender over its own file for the purpose."""
    purpose, mode = payload.text("purpose"), payload.text("mode")
    if mode not in ("both", "active"):
        raise ConfigError(f"streaming PSI mode {mode!r}: choose 'both' or 'active'")
    source = _id_file(ctx, purpose)
    part = ctx.part(StreamPart)
    part.reset()
    part.source, part.file = (ctx.sender, purpose, mode), source
    part.rows = count_rows(source)
    return {"rows": part.rows}


def handle_split(ctx: NodeContext, payload: Fields) -> Payload:
    part = ctx.part(StreamPart)
    if part.source is None or part.source[0] != ctx.sender or part.file is None or part.spill is not None:
        raise ProtocolError(f"{SPLIT_KIND} without this party's {OPEN_KIND} from {ctx.sender!r} just before")
    n_buckets = payload.integer("buckets")
    if not 1 <= n_buckets <= MAX_BUCKETS:  # the larger party's rows decide: a small partner may get more than its own
        raise ProtocolError(f"{n_buckets} buckets: between 1 and {MAX_BUCKETS:,}")
    part.memory_mb = part.rows * BYTES_PER_ID / n_buckets / 2**20
    store = store_of(ctx)
    assert store is not None
    part.key = psi.new_key()  # this party's own, for this intersection only
    part.salt = payload.array("salt").tobytes()
    part.spill = Spill(part.file, part.salt, n_buckets, batch_rows=batch_rows_for(
        max(MIN_MEMORY_MB, part.memory_mb)), parent=store.folder)
    if part.spill.rows != part.rows:
        raise DataError(f"party {ctx.party!r}: its file changed while it was read ({part.rows} rows, then "
                        f"{part.spill.rows})")
    part.shared = np.zeros(part.rows, dtype=bool) if part.source[2] == "both" else None
    return {"rows": part.spill.rows}


def handle_bucket(ctx: NodeContext, payload: Fields) -> Payload:
    """A partner: one bucket, as one ECDH step: the asker's points blinded again and its own, shuffled."""
    part = ctx.part(StreamPart)
    if part.spill is None or part.source is None or part.source[0] != ctx.sender:
        raise ProtocolError(f"{BUCKET_KIND} before this party's {SPLIT_KIND} with {ctx.sender!r}")
    k = payload.integer("bucket")
    if not 0 <= k < part.spill.n_buckets or k in part.done:
        raise ProtocolError(f"bucket {k}: not one of the {part.spill.n_buckets} buckets, or asked twice")
    try:
        return _answer_bucket(part, k, payload)
    except Exception:
        part.reset()  # a bucket that fails ends this side: its buckets removed, the asker must open again
        raise


def _answer_bucket(part: StreamPart, k: int, payload: Fields) -> Payload:
    assert part.spill is not None and part.source is not None
    if part.source[2] == "both":
        _apply(part, payload.array("matched"))
    positions, names = part.spill.bucket(k)
    order = psi.shuffled(len(names))
    double, own = psi.answer(part.key, [names[i] for i in order.tolist()], payload.array("points"),
                             b"psi" + part.salt)
    reply: Payload = {"double": double, "points": padded(own, part.spill.padded)}  # each bucket its largest's size
    part.last = (k, positions[order])
    part.done.add(k)
    return reply


def handle_close(ctx: NodeContext, payload: Fields) -> Payload:
    """A partner: the last bucket's flags, then its record written; its buckets removed."""
    part = ctx.part(StreamPart)
    if part.spill is None or part.source is None or part.source[0] != ctx.sender or part.file is None:
        raise ProtocolError(f"{CLOSE_KIND} without a streamed intersection with {ctx.sender!r}")
    try:
        if len(part.done) != part.spill.n_buckets:
            raise ProtocolError(f"{CLOSE_KIND} after {len(part.done)} of {part.spill.n_buckets} buckets")
        if part.source[2] == "both":
            _apply(part, payload.array("matched"))
        store = store_of(ctx)
        assert store is not None
        file, size, modified = _file_facts(part.file)
        count = int(part.shared.sum()) if part.shared is not None else -1
        record = Streamed(token=payload.text("token"), party=ctx.party, peer=ctx.sender, side="partner",
                          purpose=part.source[1], mode=part.source[2], file=file, file_bytes=size,
                          file_modified=modified, rows=part.rows, shared=count, buckets=part.spill.n_buckets,
                          memory_mb=round(part.memory_mb, 3), created=now())
        path = write_record(store.folder, record, part.shared)
        logger.info("party %s kept its streamed alignment with %s in %s", ctx.party, ctx.sender, path)
        return {"count": max(count, 0)}
    finally:
        part.reset()


@dataclass(frozen=True)
class StreamResult:
    """The asker's record of a streamed intersection, and where it wrote it."""

    record: Streamed
    path: Path
    shared: np.ndarray  # one flag per row of the asker's file


def stream_intersect(fed: Aligning, own: IdFile, partner: str, *, folder: Path, purpose: str = "train",
                     mode: str = "both", memory_mb: float = 256.0) -> StreamResult:
    """Intersect the IDs of ``own`` (this party's file) with those of ``partner``'s file for ``purpose``, a
    bucket at a time, each party's working memory for a bucket under ``memory_mb``; both parties keep the
    result (this one under ``folder``)."""
    if mode not in ("both", "active"):
        raise ConfigError(f"streaming PSI mode {mode!r}: choose 'both' or 'active'")
    rows = count_rows(own)
    theirs = fed.exchange(OPEN_KIND, {partner: {"purpose": purpose, "mode": mode}})[partner]
    check_payload(OPEN_KIND, theirs, OPENED)
    n_buckets = buckets_for(max(rows, theirs.integer("rows"), 1), memory_mb)
    salt = secrets.token_bytes(32)
    key = psi.new_key()
    spill = Spill(own, salt, n_buckets, batch_rows=batch_rows_for(memory_mb), parent=folder)
    try:
        if spill.rows != rows:
            raise DataError(f"{own.path} changed while it was read ({rows} rows, then {spill.rows})")
        reply = fed.exchange(SPLIT_KIND, {partner: {"salt": np.frombuffer(salt, dtype=np.uint8).copy(),
                                                    "buckets": n_buckets}})[partner]
        check_payload(SPLIT_KIND, reply, SPLITTED)
        logger.info("streaming PSI with %s: %d and %d rows in %d buckets", partner, rows, reply.integer("rows"),
                    n_buckets)
        shared = np.zeros(rows, dtype=bool)
        matched = np.zeros(0, dtype=bool)
        for k in _progress(n_buckets, f"streaming PSI with {partner}"):
            positions, names = spill.bucket(k)
            with psi.Blinder(key, size=len(names)) as blinder:
                mine = padded(blinder.names(names, b"psi" + salt)(), spill.padded)
            answer = fed.exchange(BUCKET_KIND, {partner: {"bucket": k, "points": mine, "matched": matched}})[partner]
            check_payload(BUCKET_KIND, answer, BUCKETED)
            held, found = psi.compare(mine, answer, key, party=partner, both=mode == "both")
            shared[positions[held[:len(positions)]]] = True
            matched = found if found is not None else np.zeros(0, dtype=bool)
            del mine, answer, held, found, names, positions
        token = secrets.token_hex(16)
        closed = fed.exchange(CLOSE_KIND, {partner: {"token": token, "matched": matched}})[partner]
        check_payload(CLOSE_KIND, closed, CLOSED)
        if mode == "both" and closed.integer("count") != int(shared.sum()):
            raise ProtocolError(f"party {partner!r} counts {closed.integer('count')} shared people, "
                                f"{int(shared.sum())} here")
        file, size, modified = _file_facts(own)
        record = Streamed(token=token, party=fed.party, peer=partner, side="asker", purpose=purpose, mode=mode,
                          file=file, file_bytes=size, file_modified=modified, rows=rows, shared=int(shared.sum()),
                          buckets=n_buckets, memory_mb=memory_mb, created=now())
        path = write_record(folder, record, shared)
        logger.info("streamed alignment with %s: %d of %d rows shared, kept in %s", partner, record.shared, rows,
                    path)
        return StreamResult(record=record, path=path, shared=shared)
    finally:
        spill.close()


def _progress(n: int, what: str) -> Iterator[int]:
    from vflo.progress import progress_bar

    with progress_bar(enabled=n > 1, description=what) as bar:
        task = bar.add_task(what, total=n)
        for k in range(n):
            yield k
            bar.advance(task)
