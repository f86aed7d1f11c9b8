"""`specedge chat MODEL`: a terminal chat on top of specedge.Engine (apps/api.py).

    > user text             streamed answer on stdout; a stats line per answer on stderr
    > /help                 the slash commands (COMMANDS below)
    Ctrl-C while answering  stops the answer ("[stopped]"), keeps the conversation; back to the prompt
    Ctrl-C twice at the prompt, Ctrl-D, /exit   quit

The conversation is kept as messages and rendered with the model's chat template each turn; the Engine's Session
(runtime/session.py) holds the KV cache of the previous turn, so a turn prefills only the tokens past the shared
prefix (the new user message and the template's glue), not the whole conversation.

An interrupted answer stays in the conversation (marked "interrupted" in /save files): the user saw it, the next
message usually refers to it ("go on", "shorter"), and its tokens are already in the KV cache, so keeping it costs
nothing while dropping it would make the next turn re-prefill from the cut.

Answers run to the end of the turn, at most 1024 tokens by default (--max-tokens, /set max_tokens none: no limit),
stop where they start repeating themselves (finish `repetition`; /set repetition_stop off), and sample with the
model's defaults (assembly/sampling_defaults.py). When the rendered conversation plus room for the answer (answer_reserve: min(512,
ctx // 4) tokens, or max_tokens when smaller) would not fit the context (--ctx), the oldest user/assistant turns
are dropped, in pairs, until it fits; the system prompt is always kept, and one line on stderr says so. The model
sees the trimmed conversation (the next turn re-prefills it: the cached prefix changed); /save keeps every message,
the dropped ones marked "dropped". A last message too long to fit even alone is refused and the conversation stays.
"""
from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import click

from ..assembly.decoder import CallSettings, parse_logit_bias
from ..runtime.stats import CallStats
from ..runtime.types import FinishReason
from .api import Engine
from .chat_state import (OPTION_NAMES, OPTIONAL, SHORT_ANSWER, Conversation, Totals, answer_reserve, parse_option,
                         set_keys, stats_line, unset_value)
from .options import STOP, call_options, call_settings, engine_options, open_from

COMMANDS = {
    "/reset": "clear the conversation (keeps the system prompt)",
    "/system TEXT": "set the system prompt and start over (/system alone shows it; /system - removes it)",
    "/stats": "the last answer's full statistics and the session totals",
    "/drafter SPEC": "switch the drafter live (ngram, none, model:<...>, exit:<l>, recycle, ...); alone: show it",
    "/set KEY VALUE": f"change a per-call option ({set_keys()}; `default` = the default; `none` = no limit / the "
                      "model's / no bias); alone: show them",
    "/save PATH": "write the conversation and settings as JSON (resume with `specedge chat MODEL --load PATH`)",
    "/help": "this list",
    "/exit": "quit (also /quit, Ctrl-D, Ctrl-C twice at the prompt)",
}


class ChatLoop:
    """The read-eval loop; output goes through click.echo (stdout: answers and command output; stderr: status)."""

    def __init__(self, engine: Engine, conv: Conversation) -> None:
        self.engine, self.conv = engine, conv
        self.totals, self.last = Totals(), None

    def run(self) -> None:
        # A process started in the background by a non-interactive shell (`cmd &`, nohup, some CI runners) inherits
        # SIGINT as ignored, and Python then never raises KeyboardInterrupt: Ctrl-C at the prompt would do nothing.
        # An interactive chat wants Ctrl-C whatever its parent did.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self._loop()
        finally:
            signal.signal(signal.SIGINT, previous)

    def _loop(self) -> None:
        how = "plain decoding" if self.engine.drafter_name == "none" else f"drafter {self.engine.drafter_name}"
        say(f"specedge chat ({self.engine.name}, {self.engine.backend_kind}, {how}): "
            "type a message; /help lists commands; Ctrl-C stops an answer; Ctrl-D exits.")
        if self.conv.messages:
            say(f"(resumed {len(self.conv.messages)} messages)")
        armed = False  # one Ctrl-C at the prompt arms, the second exits
        while True:
            try:
                line = input("> ")
            except EOFError:
                click.echo("")
                return
            except KeyboardInterrupt:
                if armed:
                    click.echo("")
                    return
                armed = True
                say("\n(Ctrl-C again or Ctrl-D to exit)")
                continue
            armed = False
            text = line.strip()
            if text.startswith("/"):
                if self.command(text) == "exit":
                    return
            elif text:
                self.answer(line)

    def answer(self, line: str) -> None:
        """Stream one answer; Ctrl-C sets the cancel Event (the Engine stops between tokens) from the moment the
        message is taken until the answer ends."""
        self.conv.messages.append({"role": "user", "content": line})
        before = self.conv.start
        if not self.fit():  # the conversation stays as it was
            self.conv.messages.pop()
            self.conv.start = before
            return
        cancel = threading.Event()
        previous = signal.signal(signal.SIGINT, lambda *_: cancel.set())
        try:
            text, stats = self.stream(cancel)
        finally:
            signal.signal(signal.SIGINT, previous)
        if text is None:  # failed: the question goes too, the conversation stays as it was
            self.conv.messages.pop()
            return
        reply = {"role": "assistant", "content": text, "tokens": stats.decode.n_generated}
        if stats.finish_reason is FinishReason.CANCELLED:
            reply["interrupted"] = True
            say("[stopped]")
        if text or not reply.get("interrupted"):
            self.conv.messages.append(reply)
        else:
            self.conv.messages.pop()  # stopped before any text: forget the question too
        self.last = stats
        self.totals.add(stats)
        say(stats_line(stats))
        if stats.finish_reason is FinishReason.REPETITION:
            say("(the answer was repeating itself, so it stopped: /set repetition_stop off lets it run on, a "
                "sampled answer (/set temperature 0.7) loops less)")
        if stats.finish_reason is FinishReason.LENGTH:
            limit = self.conv.options.get("max_tokens")
            if limit is not None and stats.decode.n_generated >= limit:
                say(f"(the answer stopped at max_tokens {limit}: /set max_tokens to more, or none for no limit)")
            else:
                say(f"(the answer reached the context limit of {self.engine.context_length} tokens; the next message "
                    "shortens the longest answers and drops the oldest turns to make room, or restart with a larger "
                    "--ctx)")

    def fit(self) -> bool:
        """Make the rendered conversation plus answer_reserve fit the context, saying what changed in one line:
        first shorten the longest answers over ctx // SHORT_ANSWER tokens to that many (a runaway answer never
        outlives the conversation's start), then drop the oldest user/assistant turns (in pairs; the system prompt
        stays). False, after saying why, when the last message does not fit even alone (the caller restores the
        conversation)."""
        conv, ctx = self.conv, self.engine.context_length
        reserve = answer_reserve(ctx, conv.options.get("max_tokens"))
        before, last = conv.start, len(conv.messages) - 1
        short = max(16, ctx // SHORT_ANSWER)
        shortened = []
        try:
            n = self.prompt_tokens()
            while n + reserve > ctx:
                long = self.longest_answer(short)
                if long is None:
                    break
                ids = self.engine.tokenizer.encode(long["content"], add_bos=False)
                long["view"] = self.engine.tokenizer.decode(ids[:short]).rstrip() + " [...]"
                shortened.append(long.get("tokens") or len(ids))
                n = self.prompt_tokens()
            while n + reserve > ctx and conv.start < last:
                conv.start += 1  # a user message, and its answer with it
                if conv.start < last and conv.messages[conv.start]["role"] == "assistant":
                    conv.start += 1
                n = self.prompt_tokens()
        except ValueError as e:  # the chat template refused the messages
            say(f"error: {e}")
            return False
        if n + reserve > ctx:
            what = "the message" + (" with the system prompt" if conv.system else "")
            say(f"(context full: {what} is {n} tokens and the answer needs room ({reserve} tokens); that does not "
                f"fit {ctx} tokens: shorten it, /set max_tokens to fewer, or restart with a larger --ctx; the "
                "conversation is unchanged)")
            return False
        done = []
        if shortened:
            done.append(f"shortened the {len(shortened)} longest answer{'s' if len(shortened) > 1 else ''} "
                        f"({', '.join(map(str, shortened))} tokens) to {short} tokens")
        if conv.start > before:
            done.append(f"dropped the {conv.start - before} oldest messages")
        if done:
            say(f"(context full: {' and '.join(done)} to fit {ctx} tokens)")
        return True

    def longest_answer(self, short: int) -> dict | None:
        """The longest kept assistant message not yet shortened whose text is over `short` tokens (None if none)."""
        kept = [m for m in self.conv.messages[self.conv.start:-1] if m["role"] == "assistant" and "view" not in m]
        sized = [(m.get("tokens") or len(self.engine.tokenizer.encode(m["content"], add_bos=False)), i)
                 for i, m in enumerate(kept)]
        sized = [(n, i) for n, i in sized if n > short]
        return kept[max(sized)[1]] if sized else None

    def prompt_tokens(self) -> int:
        """Tokens of the conversation as the model will see it (chat template and generation prompt included)."""
        return len(self.engine.encode(self.engine.render_chat(self.conv.render())))

    def stream(self, cancel: threading.Event) -> tuple[str | None, CallStats | None]:
        """Print the answer as it streams; returns its text and statistics, or None after printing what went
        wrong."""
        parts = []
        try:
            calls = self.engine.chat(self.conv.render(), stream=True, cancel=cancel, **self.conv.options)
            for c in calls:
                if c.text:
                    parts.append(c.text)
                    click.echo(c.text, nl=False)
        except (ValueError, RuntimeError) as e:  # too long for the context, or the backend failed mid-answer
            say(("\n" if parts else "") + f"error: {e}\n(type /reset to start a new conversation, /save PATH "
                "first to keep it)")
            return None, None
        click.echo("")
        return "".join(parts), calls.stats

    def command(self, text: str) -> str | None:
        name, _, arg = text.partition(" ")
        arg = arg.strip()
        if name in ("/exit", "/quit"):
            return "exit"
        if name == "/reset":
            self.conv.clear()  # the Session keeps the system prompt's KV: the next turn reuses it
            say("(conversation cleared)")
        elif name == "/system":
            if not arg:
                click.echo(self.conv.system or "(no system prompt)")
            else:
                self.conv.system = None if arg == "-" else arg
                self.conv.clear()
                say("(system prompt " + ("removed" if arg == "-" else "set") + "; conversation cleared)")
        elif name == "/stats":
            self.show_stats()
        elif name == "/drafter":
            self.switch_drafter(arg)
        elif name == "/set":
            self.set_option(arg)
        elif name == "/save":
            if not arg:
                return say("usage: /save PATH")
            try:
                self.conv.save(Path(arg).expanduser(), self.engine, self.totals)
                say(f"(saved {len(self.conv.messages)} messages to {arg})")
            except OSError as e:
                say(f"error: cannot write {arg}: {e}")
        elif name == "/help":
            for usage, what in COMMANDS.items():
                click.echo(f"  {usage:16s} {what}")
        else:
            say(f"unknown command {name}; /help lists the commands")
        return None

    def show_stats(self) -> None:
        if self.last is None:
            click.echo("(no answer yet)")
        else:
            click.echo("last answer:")
            for key, value in self.last.to_dict().items():
                click.echo(f"  {key}: {round(value, 4) if isinstance(value, float) else value}")
        t = self.totals
        rate = t.tokens / t.decode_s if t.decode_s > 0 else 0.0
        click.echo(f"session: {t.answers} answers ({t.interrupted} stopped), {t.tokens} tokens, {rate:.1f} tok/s, "
                   f"prompt tokens {t.prefilled} prefilled / {t.reused} reused, drafter {self.engine.drafter_name}, "
                   f"context {self.engine.context_length}")

    def switch_drafter(self, spec: str) -> None:
        if not spec:
            return click.echo(f"drafter: {self.engine.drafter_name}")
        try:
            self.engine.set_drafter(spec)
        except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
            return say(f"error: {e}\n(keeping drafter {self.engine.drafter_name})")
        say(f"(drafter: {spec})")

    def set_option(self, arg: str) -> None:
        key, _, value = arg.partition(" ")
        if not value.strip():
            opts = self.conv.options
            call = CallSettings(**{k: opts[k] for k in OPTION_NAMES
                                   if k in opts and (opts[k] is not None or k in OPTIONAL)})
            defaults = self.engine.sampling_defaults
            used = call.sampling(defaults)
            for k in OPTION_NAMES:
                value = getattr(call, k)
                if k == "max_tokens" and value is None:
                    value = "none (to the end of the turn or the context limit)"
                elif value is None:  # a sampling value the defaults fill (SamplingParams names it as CallSettings does)
                    value = unset_value(k, getattr(used, k), used.greedy, defaults)
                click.echo(f"  {k} = {value}")
            return
        try:
            self.conv.options = parse_option(key, value.strip(), self.conv.options)
        except ValueError as e:
            return say(f"error: {e}")
        say(f"({key} = {self.conv.options[key]})")


BASE_MODEL_CAP = 256  # tokens per answer of a model that ships no chat template (chat only; --max-tokens wins)


def base_model(engine: Engine) -> bool:
    """A GGUF model whose file ships no chat template (a base model: we render a family default it was not tuned
    on)."""
    gguf = getattr(engine.model, "gguf", None)
    return gguf is not None and not gguf.metadata.get("tokenizer.chat_template")


def say(message: str) -> None:
    click.echo(message, err=True)


def enable_history() -> None:
    """Line editing and history for input() where the readline module exists (not on plain Windows)."""
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401  (importing it is what turns it on)
        except ImportError:
            pass


@click.command("chat")
@click.argument("model")
@engine_options
@call_options
@STOP
@click.option("--system", default=None, help="System prompt.")
@click.option("--load", "load_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Resume a conversation saved with /save (its system prompt, messages and options; options "
                   "given on this command line win).")
def chat_cmd(**o) -> None:
    """Chat with MODEL in the terminal: streaming answers, multi-turn with KV-cache reuse, slash commands
    (/help), Ctrl-C stops an answer."""
    call_settings(o)  # a bad sampling value fails before the model loads
    bias = parse_logit_bias(o["logit_bias"])
    conv = Conversation(o["system"], [], {**{k: o[k] for k in OPTION_NAMES}, "logit_bias": bias})
    if o["load_path"] is not None:
        try:
            loaded = Conversation.load(o["load_path"])
        except ValueError as e:
            raise click.ClickException(str(e)) from None
        ctx = click.get_current_context()
        given = {k for k in (*OPTION_NAMES, "system")
                 if ctx.get_parameter_source(k) is click.core.ParameterSource.COMMANDLINE}
        conv.messages = loaded.messages
        conv.system = o["system"] if "system" in given else loaded.system
        conv.options.update({k: v for k, v in loaded.options.items() if k not in given})
    conv.options["stop"] = list(o["stop"])
    engine = Engine(open_from(o), o["model"])
    ctx = click.get_current_context()
    chosen = ctx.get_parameter_source("max_tokens") is click.core.ParameterSource.COMMANDLINE or (
        o["load_path"] is not None and "max_tokens" in loaded.options)
    if base_model(engine) and not chosen:
        conv.options["max_tokens"] = BASE_MODEL_CAP
        say(f"({o['model']} ships no chat template: a base model continues text rather than answering in turns, "
            f"and rarely stops, so answers are capped at {BASE_MODEL_CAP} tokens; /set max_tokens changes it)")
    enable_history()
    ChatLoop(engine, conv).run()
