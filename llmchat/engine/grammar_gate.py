"""The grammar gate: a llama.cpp sampler, written in Python, that holds each pick to a grammar.

Why it is built this way:
- llama.cpp's grammar sampler checks every token of the vocabulary at every step (Gemma 3 has
  262,144), so instead the gate lets the usual samplers pick first and asks the grammar about
  that one token; only when the grammar refuses it are all candidates filtered and the pick made
  again (what llama.cpp's common sampler did before 2025-12). At temperature 0 the result is
  exactly the grammar-first result: if the top token is allowed it is also the top allowed token.
  At temperature > 0 an allowed token is kept with its unconstrained probability, as in llama.cpp
  then. On a refusal the gate first filters only the top candidates by logit (`TOP_CANDIDATES`,
  ties at the edge included) and passes over the whole vocabulary only when none of them is
  allowed: at temperature 0 that is still exact (the best allowed token, if it is among them, is
  the best allowed of all), and a refusal costs about 1 ms on Gemma 3 instead of a 40-60 ms pass.
  At temperature > 0 the pick is then among the allowed top candidates, which hold nearly all of
  the probability top-k/top-p/min-p keep. Measured cost: bench/results/schema_cost.md.
- Before the top candidates, the gate asks the grammar about one token per byte
  (engine.first_bytes): where the grammar accepts only a few first bytes (structure: after `{ `
  only a quote, inside a key only its next letter), every token starting with them is filtered
  and the pick made among all the allowed ones, exactly as a full pass would, in well under a
  millisecond (`narrow_passes`). Those are the places where none of the top candidates was
  allowed and a 40-60 ms full pass used to follow, once or more in every reply under a schema.
  Where a full pass is still needed (none of the top candidates allowed, many bytes possible),
  it too skips the tokens whose first byte is refused.
- Under a grammar a detected loop is steered out of (engine.loop_exit): the gate picks the tokens
  that close the repeating list or string once the grammar allows them.
- The gate can start late (`start_after`): a thinking model writes its reasoning freely and is held
  to the grammar only once the text that ends the thinking has been sampled. A lazy tool-call
  grammar (`feed_trigger`) starts at its trigger text (`<tool_call>`): when the trigger has been
  sampled, the text from the trigger on is fed through the grammar first, as llama.cpp's lazy
  grammars do, and the grammar holds the rest of the call.

Where the gate sits in a sampler chain is llmchat.engine.sampler's job.
"""

from __future__ import annotations

import ctypes
import math
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from llmchat import interrupts
from llmchat.engine.loop_exit import PATIENCE, JsonNesting
from llmchat.errors import UsageError

if TYPE_CHECKING:
    from llmchat.engine.first_bytes import FirstBytes
    from llmchat.engine.grammar import Grammar
    from llmchat.engine.loop_exit import LoopExit

# On a refusal, how many of the best candidates are filtered before the whole vocabulary is.
TOP_CANDIDATES = 256
# On a refusal, up to how many tokens whose first byte the grammar may accept are filtered at once,
# before (and instead of) the best candidates: all of the grammar's choices, for a few hundred checks.
NARROW_CANDIDATES = 4096
_NOT_BUILT = object()


def check_grammar(grammar: Grammar, vocab: Any) -> None:
    """Parse the grammar with llama.cpp as the sampler will (UsageError with llama.cpp's reason)."""
    from llmchat.engine import logs
    from llmchat.engine.bindings import llama_cpp

    logs.recent_errors.clear()
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.text.encode("utf-8"), b"root")
    if not sampler:
        reason = logs.last_error() or "llama.cpp could not parse it"
        raise UsageError(f"{grammar.source}: not a usable GBNF grammar: {' '.join(reason.split())}; fix the grammar")
    llama_cpp.llama_sampler_free(sampler)


_live: dict[int, GrammarGate] = {}  # gates llama.cpp holds, kept alive for their callbacks
_retired: list[GrammarGate] = []  # freed by llama.cpp; dropped at the next gate (not inside the callback)


class GrammarGate:
    """A llama.cpp sampler that owns the samplers after the penalties (`inner`) and a grammar.

    Put it into a chain in place of those samplers: `apply` picks with `inner`, keeps the pick when
    the grammar allows it, and otherwise filters every candidate by the grammar and picks again;
    `accept` advances the grammar. llama.cpp frees it with the chain, and it frees `inner`.
    With `start_after`, the grammar applies only once that text has been sampled.
    """

    def __init__(
        self,
        vocab: Any,
        grammar: Grammar,
        inner: Any,
        *,
        start_after: str | None = None,
        greedy: bool = False,
        loop_exit: LoopExit | None = None,
        feed_trigger: bool = False,
    ):
        from llmchat.engine.bindings import llama_cpp

        _retired.clear()
        self._llama = llama_cpp
        self.vocab = vocab
        self.inner = inner
        # A gate that cannot start frees what it was given and what it made (a Ctrl-C here too);
        # once started, llama.cpp frees them through `_free` with the chain that holds the gate.
        with ExitStack() as undo:
            undo.callback(llama_cpp.llama_sampler_free, inner)
            self.grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar.text.encode("utf-8"), b"root")
            if not self.grammar:
                check_grammar(grammar, vocab)  # raises with llama.cpp's reason
                raise UsageError(f"{grammar.source}: llama.cpp refused the grammar")
            undo.callback(llama_cpp.llama_sampler_free, self.grammar)
            self._start(llama_cpp, start_after, greedy, loop_exit, feed_trigger)
            from llmchat.engine.first_bytes import grammar_traits

            names_tokens, self._wide_negation = grammar_traits(grammar.text)
            self._heads_usable = not names_tokens  # a grammar that names tokens holds ids, not text
            undo.pop_all()
        if loop_exit is not None:
            loop_exit.gate = self
        _live[id(self)] = self

    def _start(
        self, llama_cpp: Any, start_after: str | None, greedy: bool, loop_exit: LoopExit | None, feed_trigger: bool
    ) -> None:
        """The gate's state and its llama.cpp sampler (`self.sampler`), over `inner` and the grammar."""
        self.start_after = start_after
        self.active = not start_after
        self.feed_trigger = feed_trigger  # the grammar begins with `start_after` itself (lazy)
        # llama.cpp's greedy sampler only marks its pick: the candidates need no copy to filter again.
        self.greedy = greedy
        self._seen = ""  # text sampled so far, while waiting for `start_after`
        self.rejections = 0  # picks the grammar refused
        self.narrow_passes = 0  # refusals settled among the few tokens whose first byte the grammar accepts
        self.full_passes = 0  # refusals where no top candidate was allowed: a full-vocabulary pass
        self.picks = 0
        self._heads_table: object = _NOT_BUILT  # engine.first_bytes' table, built at the first refusal
        self._heads_usable = False
        self._wide_negation = False
        self._ends = False  # whether the grammar can end here (at the last refusal)
        self._probes: Any = None  # the table's one-byte tokens, then an end-of-generation one
        self._probe_heads: Any = None
        self._head_sizes: Any = None
        self._no_heads: Any = None
        self._trusted: Any = None  # per probe: whether its refusal speaks for every token with its byte
        import numpy

        self._np = numpy
        # The JSON written under the grammar and a loop to steer out of (engine.loop_exit).
        self.loop_exit = loop_exit
        self.nesting = JsonNesting()
        self._closing: list[int] = []  # closing tokens still to pick
        self._pieces: dict[int, bytes] = {}
        self._saved = ctypes.create_string_buffer(0)
        self._one = (llama_cpp.llama_token_data * 1)()
        self._one_array = llama_cpp.llama_token_data_array(self._one, 1, -1, False)
        iface = llama_cpp.llama_sampler_i()
        self._callbacks = (
            llama_cpp.llama_sampler_i_name(self._name),
            llama_cpp.llama_sampler_i_accept(self._accept),
            llama_cpp.llama_sampler_i_apply(self._apply),
            llama_cpp.llama_sampler_i_reset(self._reset),
            llama_cpp.llama_sampler_i_free(self._free),
        )
        iface.name, iface.accept, iface.apply, iface.reset, iface.free = self._callbacks
        iface.clone = llama_cpp.llama_sampler_i_clone(0)
        self._iface = iface
        self._label = b"llmchat-grammar-gate"
        self.sampler = llama_cpp.llama_sampler_init(ctypes.pointer(iface), None)
        if not self.sampler:
            raise MemoryError("llama.cpp could not make the grammar gate's sampler")

    # llama.cpp calls these; they must never raise into C. A Ctrl-C landing inside one is deferred
    # to the next token (llmchat.interrupts): raised there, it would be dropped by ctypes halfway
    # through a pick and leave the candidate array in a state no sampler chose.
    @interrupts.native_callback
    def _name(self, smpl: Any) -> bytes:
        return self._label

    @interrupts.native_callback
    def _apply(self, smpl: Any, cur_p: Any) -> None:
        llama = self._llama
        if not self.active:
            llama.llama_sampler_apply(self.inner, cur_p)
            return
        cur = cur_p.contents
        if self._closing:  # the rest of a loop's closing text
            self._force(cur, self._closing.pop(0))
            return
        steering = self.loop_exit is not None and self.loop_exit.keep is not None
        if steering and self._close_loop(cur, None):
            return
        self._pick(cur_p)
        if steering:
            self._close_loop(cur, int(cur.data[cur.selected].id))

    def _pick(self, cur_p: Any) -> None:
        """The usual samplers' pick if the grammar allows it, else the best allowed candidate."""
        llama = self._llama
        cur = cur_p.contents
        size = int(cur.size)
        nbytes = size * ctypes.sizeof(llama.llama_token_data)
        if ctypes.sizeof(self._saved) < nbytes:
            self._saved = ctypes.create_string_buffer(nbytes)
        if not self.greedy:
            ctypes.memmove(self._saved, cur.data, nbytes)
        llama.llama_sampler_apply(self.inner, cur_p)
        self.picks += 1
        if 0 <= cur.selected < cur.size and self._allows(cur.data[cur.selected]):
            return
        self.rejections += 1
        if not self.greedy:
            ctypes.memmove(cur.data, self._saved, nbytes)
        cur.size, cur.selected, cur.sorted = size, -1, False
        heads = self._allowed_heads()
        if heads is not None and heads[1] <= NARROW_CANDIDATES:
            if self._pick_among(cur_p, size, self._rows_starting_with(cur_p, size, heads[0])):
                self.narrow_passes += 1
                return
        if self._pick_among_top(cur_p, size):
            return
        self.full_passes += 1
        if heads is not None and self._pick_among(cur_p, size, self._rows_starting_with(cur_p, size, heads[0])):
            return
        llama.llama_sampler_apply(self.grammar, cur_p)
        llama.llama_sampler_apply(self.inner, cur_p)

    def _rows(self, cur_p: Any, size: int) -> Any:
        """The candidates as an (id, logit bits, p bits) int32 array over llama.cpp's memory."""
        data = ctypes.cast(cur_p.contents.data, ctypes.POINTER(ctypes.c_int32))
        return self._np.ctypeslib.as_array(data, shape=(size, 3))

    def _pick_among_top(self, cur_p: Any, size: int) -> bool:
        """Filter only the best `TOP_CANDIDATES` (and any tied with the last of them) by the
        grammar and pick among those allowed; False, with the candidates as they were, when none is."""
        np = self._np
        if size <= TOP_CANDIDATES:
            return False
        logits = self._rows(cur_p, size)[:, 1].view(np.float32)
        edge = np.partition(logits, size - TOP_CANDIDATES)[size - TOP_CANDIDATES]
        best = np.flatnonzero(logits >= edge)
        if len(best) > 4 * TOP_CANDIDATES:  # a flat distribution: no short list to try
            return False
        return self._pick_among(cur_p, size, best)

    def _pick_among(self, cur_p: Any, size: int, at: Any) -> bool:
        """Filter the candidates at rows `at` (ascending) by the grammar and pick among those
        allowed; False, with the candidates as they were, when none is.

        The kept candidates stay in their original (token id) order at the front of the array, so
        that a greedy pick breaks ties as it would over the whole vocabulary."""
        np = self._np
        n = len(at)
        if n == 0:
            return False
        cur = cur_p.contents
        rows = self._rows(cur_p, size)
        front = rows[:n].copy()
        rows[:n] = rows[at]
        cur.size, cur.selected, cur.sorted = n, -1, False
        self._llama.llama_sampler_apply(self.grammar, cur_p)
        if not np.isfinite(rows[:n, 1].view(np.float32)).any():
            rows[:n] = front  # restore: the caller passes over more of the vocabulary
            cur.size, cur.selected, cur.sorted = size, -1, False
            return False
        self._llama.llama_sampler_apply(self.inner, cur_p)
        return True

    # --- skipping tokens by their first byte (engine.first_bytes) -----------------------------------
    def _allowed_heads(self) -> tuple[Any, int] | None:
        """Which first bytes the grammar may accept here (a mask over 1 + byte; index 0 is an
        empty text) and how many tokens start with them; None where the table cannot tell."""
        table = self._first_bytes()
        if table is None:
            return None
        allowed = self._probes.allowed(self.grammar)
        heads = self._no_heads.copy()
        heads[self._probe_heads[~allowed[:-1] & self._trusted]] = False
        self._ends = bool(allowed[-1])  # the grammar can end here
        return heads, int(self._head_sizes[heads].sum())

    def _rows_starting_with(self, cur_p: Any, size: int, heads: Any) -> Any:
        """The rows of the candidates whose first byte is in `heads`, and the end-of-generation
        tokens where the grammar can end, ascending."""
        np = self._np
        table = self._first_bytes()
        assert table is not None
        kept = np.flatnonzero(heads)
        if len(kept) < 32:  # a few bytes: their tokens, from the table's groups
            groups = [table.by_byte[table.bounds[b] : table.bounds[b + 1]] for b in kept]
            ids = np.sort(np.concatenate([*groups, np.empty(0, dtype=np.int32)]))
        else:
            ids = np.flatnonzero(heads[table.first + 1]).astype(np.int32)
        if self._ends:
            ids = np.union1d(ids, table.end_tokens(self._llama, self.vocab))
        ids_here = self._rows(cur_p, size)[:, 0]
        if size == table.n_vocab and bool((ids_here[ids] == ids).all()):
            return ids  # the usual case: candidate i is token i
        where = np.full(table.n_vocab, -1, dtype=np.int64)
        where[ids_here] = np.arange(size)
        at = where[ids]
        return np.sort(at[at >= 0])

    def _first_bytes(self) -> FirstBytes | None:
        if self._heads_table is _NOT_BUILT:
            table = None
            if self._heads_usable:
                from llmchat.engine.first_bytes import first_bytes

                table = first_bytes(self._llama, self.vocab, int(self._llama.llama_vocab_n_tokens(self.vocab)))
            if table is not None:
                np = self._np
                from llmchat.engine.first_bytes import Candidates

                self._probes = Candidates(self._llama, np.append(table.probe_ids, np.int32(max(table.eos, 0))))
                bytes_ = table.probe_bytes
                self._probe_heads = bytes_.astype(np.int64) + 1  # a byte's place in a mask over 1 + byte
                self._head_sizes = np.diff(table.bounds)  # how many tokens start with each
                self._no_heads = np.ones(257, dtype=bool)
                self._no_heads[0] = False  # llama.cpp refuses an empty text (end-of-generation tokens aside)
                # Beyond ASCII, a refused byte speaks for its tokens only without a negated class
                # that holds a non-ASCII character (engine.first_bytes).
                self._trusted = (bytes_ < 0x80) | (table.sound[bytes_] & (not self._wide_negation))
                if table.eos < 0:
                    table = None  # where the grammar can end is not known: no byte is skipped
            self._heads_table = table
        return self._heads_table  # type: ignore[return-value]

    # --- steering out of a loop (engine.loop_exit) ------------------------------------------------
    def _close_loop(self, cur: Any, picked: int | None) -> bool:
        """While steering out of a loop: pick the first token of the text that closes the
        repeating structure, when the grammar allows that text now (True).

        Inside an item of the repeating list (a string, an object) the model may first finish it,
        for up to `PATIENCE` picks: the closing text replaces the model's `picked` token once that
        token would end the item, so that the list ends after a whole item, not a cut one."""
        loop_exit, nesting = self.loop_exit, self.nesting
        assert loop_exit is not None and loop_exit.keep is not None
        text = nesting.closing_text(loop_exit.keep)
        if text == "":
            loop_exit.keep = None  # the model closed the repeating structure itself
            return False
        if text is None:  # in the middle of an escape
            return False
        item_level = loop_exit.keep + 1
        if len(nesting.stack) > item_level and loop_exit.waited < PATIENCE:
            if picked is None:
                return False  # first see what the model picks
            loop_exit.waited += 1
            if not nesting.reaches(self._piece(picked), item_level) and loop_exit.waited < PATIENCE:
                return False
        tokens = self._tokenize(text)
        if not tokens or not self._allows_all(tokens):
            return False
        loop_exit.closed()
        self._closing = tokens[1:]
        self._force(cur, tokens[0])
        return True

    @staticmethod
    def _force(cur: Any, token: int) -> None:
        """Make `token` the pick: llama.cpp takes the id at `selected` (this is the chain's last step)."""
        cur.data[0].id = token
        cur.selected = 0

    def _tokenize(self, text: str) -> list[int]:
        llama = self._llama
        data = text.encode("utf-8")
        buffer = (llama.llama_token * (len(data) + 4))()
        n = llama.llama_tokenize(self.vocab, data, len(data), buffer, len(buffer), False, False)
        return list(buffer[: max(n, 0)])

    def _allows_all(self, tokens: list[int]) -> bool:
        """Whether the grammar, from where it is now, accepts `tokens` one after the other."""
        llama = self._llama
        probe = llama.llama_sampler_clone(self.grammar)
        try:
            for token in tokens:
                one = self._one[0]
                one.id, one.logit, one.p = token, 0.0, 0.0
                self._one_array.size, self._one_array.selected, self._one_array.sorted = 1, -1, False
                llama.llama_sampler_apply(probe, ctypes.byref(self._one_array))
                if not math.isfinite(self._one[0].logit):
                    return False
                llama.llama_sampler_accept(probe, token)
            return True
        finally:
            llama.llama_sampler_free(probe)

    def _piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            buffer = ctypes.create_string_buffer(256)
            n = self._llama.llama_token_to_piece(self.vocab, token, buffer, 256, 0, False)
            piece = self._pieces[token] = buffer.raw[: max(n, 0)]
        return piece

    def _allows(self, candidate: Any) -> bool:
        one = self._one[0]
        one.id, one.logit, one.p = candidate.id, candidate.logit, candidate.p
        self._one_array.size, self._one_array.selected, self._one_array.sorted = 1, -1, False
        self._llama.llama_sampler_apply(self.grammar, ctypes.byref(self._one_array))
        return bool(math.isfinite(self._one[0].logit))

    @interrupts.native_callback
    def _accept(self, smpl: Any, token: int) -> None:
        llama = self._llama
        llama.llama_sampler_accept(self.inner, token)
        if self.active:
            llama.llama_sampler_accept(self.grammar, token)
            if self.loop_exit is not None:
                self.nesting.feed(self._piece(token))
            return
        assert self.start_after is not None
        piece = ctypes.create_string_buffer(256)
        n = llama.llama_token_to_piece(self.vocab, token, piece, 256, 0, True)  # control tokens as text
        self._seen += piece.raw[: max(n, 0)].decode("utf-8", errors="replace")
        if self.start_after in self._seen:
            if self.feed_trigger:
                self._start_at_trigger()
                return
            self.active = True
            self._seen = ""

    def _start_at_trigger(self) -> None:
        """Feed the text from the trigger on through the grammar and switch it on. When the
        grammar refuses that text (the token that completed the trigger carried more than the
        grammar allows), it stays off: the reply is free text and the parser decides."""
        assert self.start_after is not None
        tail = self._seen[self._seen.index(self.start_after) :]
        self._seen = ""
        tokens = self._tokenize(tail)
        if not self._allows_all(tokens):
            return
        for token in tokens:
            self._llama.llama_sampler_accept(self.grammar, token)
            if self.loop_exit is not None:
                self.nesting.feed(self._piece(token))
        self.active = True

    @interrupts.native_callback
    def _reset(self, smpl: Any) -> None:
        self._llama.llama_sampler_reset(self.inner)
        self._llama.llama_sampler_reset(self.grammar)
        self.active = not self.start_after
        self._seen = ""
        self.nesting = JsonNesting()
        self._closing = []

    @interrupts.native_callback
    def _free(self, smpl: Any) -> None:
        self._llama.llama_sampler_free(self.inner)
        self._llama.llama_sampler_free(self.grammar)
        self.inner = self.grammar = None
        if self.loop_exit is not None and self.loop_exit.gate is self:
            self.loop_exit.gate = None
        gate = _live.pop(id(self), None)
        if gate is not None:
            _retired.append(gate)
