"""The sandbox's state (generations, ledger, inputs, call log, pending faults, id counters) and its journal.

State lives in memory behind one lock. Every mutation is one JSON line appended to
STATE_DIR/journal.jsonl before it is applied, and start-up replays the journal through the same
`_apply`, so a server killed with os._exit comes back with everything it had answered or charged.
No fsync: this survives process crashes, not power loss.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from datetime import datetime, timezone
from decimal import Decimal

from . import catalog

JOURNAL_NAME = "journal.jsonl"
INPUTS_DIR = "inputs"

ID_PREFIXES = {"gen": "gen", "ch": "ch", "inp": "inp", "msg": "msg", "flt": "flt"}



def _key_expired(gen: dict) -> bool:
    """SANDBOX_KEY_TTL_S (unset: never): how long a request_id is remembered, as a real provider's key
    lives for a day or so. Past it, a repeat of the key is a new generation."""
    ttl = float(os.environ.get("SANDBOX_KEY_TTL_S") or 0)
    return ttl > 0 and time.time() - gen["created_at"] >= ttl

class IdempotencyConflict(Exception):
    """A keyed model saw a request_id again with a different prompt or params."""

    def __init__(self, generation_id: str):
        super().__init__(generation_id)
        self.generation_id = generation_id


class Reset(Exception):
    """The sandbox was reset after this call came in: the call writes nothing into the new state."""


class CancelRefused(Exception):
    """The generation had already reached a terminal state."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="microseconds").replace(
        "+00:00", "Z"
    )


def json_text(value) -> str:
    """A stored metadata value as lookup compares it: strings as-is, everything else as JSON text."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def generation_status(gen: dict, now: float) -> tuple[str, float | None]:
    """(status, completed_at): computed from the clock, so a restart does not pause a render."""
    if gen["cancelled_at"] is not None:
        return "cancelled", gen["cancelled_at"]
    done_at = gen["created_at"] + gen["render_s"]
    if now >= done_at:
        return ("failed" if gen["fail_message"] is not None else "succeeded"), done_at
    return "running", None


class State:
    def __init__(self, state_dir: str):
        self.dir = os.path.abspath(state_dir)
        self.inputs_dir = os.path.join(self.dir, INPUTS_DIR)
        self.journal_path = os.path.join(self.dir, JOURNAL_NAME)
        os.makedirs(self.inputs_dir, exist_ok=True)
        # One lock around every read-modify-write of the state and every journal append, so the
        # journal's order is the order the state changed in (replay must reach the same state).
        self.lock = threading.RLock()
        # Which reset a request thread's call belongs to (`enter`). A call held by a `delay` fault across a
        # reset would otherwise charge into the next test's empty ledger, or set the status of a new call
        # that took its sequence number: `_emit` refuses every write of a call from before the last reset.
        self.epoch = 0
        self._caller = threading.local()
        self._media_sha: dict[str, tuple[int, str]] = {}
        self._clear_memory()
        self._replay()
        self._fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    # -- journal -----------------------------------------------------------------------------------

    def _clear_memory(self) -> None:
        self.generations: dict[str, dict] = {}
        self.keyed: dict[tuple[str, str], str] = {}  # (model, request_id) -> generation id
        self.charges: list[dict] = []
        self.inputs: dict[str, dict] = {}
        self.calls: list[dict] = []
        self.calls_by_seq: dict[int, dict] = {}
        self.faults: list[dict] = []  # pending, in the order they were added
        # Prompt caching: prefix hash -> when it expires (monotonic). In memory only, as a provider's cache
        # is: a restart empties it, and a call then writes it again.
        self.prompt_cache: dict[str, float] = {}
        self.cache_ttl_s = float(os.environ.get("SANDBOX_CACHE_TTL_S", "300"))
        self.counters = {name: 0 for name in (*ID_PREFIXES, "call")}
        self.replayed_events = 0

    def _replay(self) -> None:
        try:
            with open(self.journal_path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return
        # A line without its newline was cut off mid-write: it never happened. Drop it so the next
        # append starts on a fresh line.
        end = data.rfind(b"\n") + 1
        if end < len(data):
            os.truncate(self.journal_path, end)
            data = data[:end]
        for number, line in enumerate(data.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                print(f"sandbox: skipping unreadable journal line {number}", file=sys.stderr)
                continue
            self._apply(event)
            self.replayed_events += 1

    def enter(self) -> int:
        """Mark the calling thread's request as one of the state since the last reset; returns its epoch."""
        self._caller.epoch = self.epoch
        return self.epoch

    def _emit(self, event: dict) -> None:
        """Append one event to the journal, then apply it. Caller holds the lock."""
        if getattr(self._caller, "epoch", self.epoch) != self.epoch:
            raise Reset()
        line = memoryview((json.dumps(event, separators=(",", ":")) + "\n").encode())
        while line:
            written = os.write(self._fd, line)
            line = line[written:]
        self._apply(event)

    def _bump(self, name: str, ident: str) -> None:
        self.counters[name] = max(self.counters[name], int(ident.rsplit("_", 1)[1]))

    def _next_id(self, name: str) -> str:
        return f"{ID_PREFIXES[name]}_{self.counters[name] + 1:06d}"

    def _apply(self, event: dict) -> None:
        kind = event["e"]
        if kind == "call":
            call = event["call"]
            self.calls.append(call)
            self.calls_by_seq[call["seq"]] = call
            self.counters["call"] = max(self.counters["call"], call["seq"])
            if event.get("fault_id"):
                self._consume_fault(event["fault_id"])
        elif kind == "status":
            call = self.calls_by_seq[event["seq"]]
            call["status"] = event["status"]
            if event.get("generation_id"):
                call["generation_id"] = event["generation_id"]
        elif kind == "generation":
            gen = event["generation"]
            self.generations[gen["id"]] = gen
            self._bump("gen", gen["id"])
            if gen["request_id"] is not None and catalog.MODELS[gen["model"]].idempotency_key:
                # The newest generation of the key: a repeat within its lifetime makes none, so this is
                # the first one unless the key had expired (SANDBOX_KEY_TTL_S).
                self.keyed[(gen["model"], gen["request_id"])] = gen["id"]
            self._add_charge(event["charge"])
        elif kind == "message":
            self._bump("msg", event["charge"]["generation_id"])
            self._add_charge(event["charge"])
        elif kind == "cancel":
            self.generations[event["id"]]["cancelled_at"] = event["at"]
        elif kind == "input":
            self.inputs[event["input"]["id"]] = event["input"]
            self._bump("inp", event["input"]["id"])
        elif kind == "faults":
            added = [dict(fault) for fault in event["faults"]]
            if event.get("first"):  # before every pending fault: the next matching calls take them
                self.faults[0:0] = added
            else:
                self.faults.extend(added)
            for fault in added:
                self._bump("flt", fault["id"])
        else:
            raise ValueError(f"unknown journal event {kind!r}")

    def _add_charge(self, charge: dict) -> None:
        self.charges.append(charge)
        self._bump("ch", charge["id"])

    def _consume_fault(self, fault_id: str) -> None:
        for index, fault in enumerate(self.faults):
            if fault["id"] == fault_id:
                fault["times"] -= 1
                if fault["times"] <= 0:
                    del self.faults[index]
                return

    # -- calls and faults --------------------------------------------------------------------------

    def log_call(
        self,
        *,
        method: str,
        path: str,
        kind: str,
        model: str | None,
        request_id=None,
        metadata=None,
        generation_id: str | None = None,
        fault_on: str | None = None,
        skip_actions: frozenset = frozenset(),
        status: int | None = None,
        prompt: dict | None = None,
    ) -> tuple[int, dict | None]:
        """Record one provider call and, when fault_on is given, take the first matching fault.

        The call and the fault's consumption are one journal event, so a crash can't consume a
        fault without the call that took it (or the reverse).
        """
        with self.lock:
            fault = None
            if fault_on is not None:
                fault = self._match_fault(fault_on, model, skip_actions)
            seq = self.counters["call"] + 1
            call = {
                "seq": seq,
                "at": iso(time.time()),
                "method": method,
                "path": path,
                "kind": kind,
                "model": model,
                "request_id": request_id,
                "metadata": metadata,
                "generation_id": generation_id,
                "fault": fault["action"] if fault else None,
                "status": status,
            }
            if prompt is not None:  # an LLM call's prompt, as it arrived (what a test checks was sent)
                call["prompt"] = prompt
            self._emit({"e": "call", "call": call, "fault_id": fault["id"] if fault else None})
            return seq, fault

    def _match_fault(self, on: str, model: str | None, skip_actions: frozenset) -> dict | None:
        for fault in self.faults:
            if fault["on"] != on or fault["action"] in skip_actions:
                continue
            if fault["model"] == "*" or (model is not None and fault["model"] == model):
                return dict(fault)  # a copy: the journal event decrements the pending one
        return None

    def set_call_status(self, seq: int, status: int, generation_id: str | None = None) -> None:
        """Record the status answered (and, for a submit, the generation or message it returned)."""
        event = {"e": "status", "seq": seq, "status": status}
        if generation_id:
            event["generation_id"] = generation_id
        with self.lock:
            self._emit(event)

    def add_faults(self, faults: list[dict], *, first: bool = False) -> list[dict]:
        """Append the faults to the pending ones, or (first) put them before every pending one."""
        with self.lock:
            numbered = []
            counter = self.counters["flt"]
            for fault in faults:
                counter += 1
                numbered.append({"id": f"flt_{counter:06d}", **fault})
            if numbered:
                self._emit({"e": "faults", "faults": numbered, "first": first})
            return self.pending_faults()

    def pending_faults(self) -> list[dict]:
        with self.lock:
            return [dict(f) for f in self.faults]

    def call_log(self) -> list[dict]:
        with self.lock:
            return [dict(c) for c in self.calls]

    # -- generations -------------------------------------------------------------------------------

    def submit_generation(
        self,
        *,
        model: catalog.Model,
        prompt: str,
        params: dict,
        request_id: str | None,
        metadata,
        fail_message: str | None,
        callback_url: str | None = None,
    ) -> tuple[dict, bool]:
        """Accept a render and charge for it; (generation, created).

        A keyed model that has seen this request_id answers with the first generation and charges
        nothing, or raises IdempotencyConflict when the prompt or params changed. The look-up and
        the insert happen under one lock, so two concurrent submits of one key create one render.
        """
        with self.lock:
            if model.idempotency_key and request_id is not None:
                existing_id = self.keyed.get((model.id, request_id))
                if existing_id is not None and _key_expired(self.generations[existing_id]):
                    existing_id = None  # forgotten: the key makes (and charges for) new work
                if existing_id is not None:
                    existing = self.generations[existing_id]
                    same = (
                        existing["prompt"] == prompt
                        and catalog.canonical_json(existing["params"]) == catalog.canonical_json(params)
                    )
                    if not same:
                        raise IdempotencyConflict(existing_id)
                    return dict(existing), False

            now = time.time()
            gen_id = self._next_id("gen")
            charge_id = self._next_id("ch")
            amount = catalog.money(model.price_usd)
            gen = {
                "id": gen_id,
                "model": model.id,
                "prompt": prompt,
                "params": params,
                "request_id": request_id,
                "metadata": metadata,
                "created_at": now,
                "render_s": float(params.get("render_s", catalog.DEFAULT_RENDER_S)),
                "fail_message": fail_message,
                "callback_url": callback_url,
                "cancelled_at": None,
                "charge_id": charge_id,
                "cost_usd": amount,
            }
            charge = {
                "id": charge_id,
                "model": model.id,
                "request_id": request_id,
                "amount_usd": amount,
                "metadata": metadata,
                "at": iso(now),
                "generation_id": gen_id,
            }
            self._emit({"e": "generation", "generation": gen, "charge": charge})
            return dict(gen), True

    def get_generation(self, gen_id: str) -> dict | None:
        with self.lock:
            gen = self.generations.get(gen_id)
            return dict(gen) if gen is not None else None

    def cancel_generation(self, gen_id: str) -> dict:
        """Cancel a running generation (no refund); CancelRefused if it already ended."""
        with self.lock:
            gen = self.generations[gen_id]
            now = time.time()
            status, _ = generation_status(gen, now)
            if status != "running":
                raise CancelRefused(status)
            self._emit({"e": "cancel", "id": gen_id, "at": now})
            return dict(self.generations[gen_id])

    def lookup(self, filters: list[tuple[str, str]], model_id: str | None) -> list[dict]:
        """Generations of lookup-capable models whose metadata matches every filter, oldest first."""
        with self.lock:
            found = []
            for gen in self.generations.values():  # dicts keep insertion (= creation) order
                if not catalog.MODELS[gen["model"]].lookup:
                    continue
                if model_id is not None and gen["model"] != model_id:
                    continue
                metadata = gen["metadata"] if isinstance(gen["metadata"], dict) else {}
                if all(key in metadata and json_text(metadata[key]) == value for key, value in filters):
                    found.append(dict(gen))
            return found

    def media_digest(self, gen: dict) -> tuple[int, str]:
        """(size, sha256) of a generation's media; computed once per generation and cached."""
        cached = self._media_sha.get(gen["id"])
        if cached is None:
            data = self.media(gen)
            cached = (len(data), hashlib.sha256(data).hexdigest())
            self._media_sha[gen["id"]] = cached
        return cached

    def media(self, gen: dict) -> bytes:
        return catalog.media_bytes(catalog.MODELS[gen["model"]], gen["prompt"], gen["params"])

    # -- messages ----------------------------------------------------------------------------------

    def cache_use(self, key: str) -> bool:
        """Read the prompt cache entry `key`: True (a hit) when it is there and not expired, and its
        lifetime starts again, as Anthropic's does on a read; False (a miss) when not, and it is written."""
        now = time.monotonic()
        with self.lock:
            hit = self.prompt_cache.get(key, 0.0) > now
            self.prompt_cache[key] = now + self.cache_ttl_s
            return hit

    def set_cache_ttl(self, seconds: float) -> float:
        with self.lock:
            self.cache_ttl_s = seconds
            return seconds

    def charge_message(
        self, *, model: catalog.Model, amount: Decimal, request_id, metadata
    ) -> tuple[str, dict]:
        """Charge one LLM call on acceptance; (message id, charge)."""
        with self.lock:
            msg_id = self._next_id("msg")
            charge = {
                "id": self._next_id("ch"),
                "model": model.id,
                "request_id": request_id,
                "amount_usd": catalog.money(amount),
                "metadata": metadata,
                "at": iso(time.time()),
                "generation_id": msg_id,
            }
            self._emit({"e": "message", "charge": charge})
            return msg_id, dict(charge)

    # -- inputs ------------------------------------------------------------------------------------

    def add_input(self, data: bytes, content_type: str) -> dict:
        with self.lock:
            inp_id = self._next_id("inp")
            # The bytes go to disk before the journal line that refers to them.
            with open(os.path.join(self.inputs_dir, inp_id), "wb") as fh:
                fh.write(data)
            record = {
                "id": inp_id,
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "content_type": content_type,
                "created_at": iso(time.time()),
            }
            self._emit({"e": "input", "input": record})
            return dict(record)

    def get_input(self, inp_id: str) -> dict | None:
        with self.lock:
            record = self.inputs.get(inp_id)
            return dict(record) if record is not None else None

    def input_bytes(self, inp_id: str) -> bytes:
        with open(os.path.join(self.inputs_dir, inp_id), "rb") as fh:
            return fh.read()

    # -- ledger and reset --------------------------------------------------------------------------

    def ledger(self) -> dict:
        with self.lock:
            charges = [dict(c) for c in self.charges]
        total = sum((Decimal(c["amount_usd"]) for c in charges), Decimal(0))
        return {"charges": charges, "total_usd": catalog.money(total)}

    def reset(self) -> None:
        """Empty everything: journal, stored inputs, memory, counters back to 1."""
        with self.lock:
            os.ftruncate(self._fd, 0)
            for name in os.listdir(self.inputs_dir):
                try:
                    os.unlink(os.path.join(self.inputs_dir, name))
                except FileNotFoundError:
                    pass
            self._clear_memory()
            self._media_sha.clear()
            self.epoch += 1
            self._caller.epoch = self.epoch  # the reset's own request goes on writing
