"""Rendering a chat template the way HF transformers does (sandboxed jinja2, same globals and filters)."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson HTML-escapes; chat templates expect plain JSON (as transformers renders it).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _GenerationTag(Extension):
    """Accept transformers' ``{% generation %}...{% endgeneration %}`` marker and render its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


@lru_cache(maxsize=16)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile ``template`` in a sandboxed environment with transformers' settings; ValueError if it does not parse."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ValueError(f"the model's chat template does not parse (line {e.lineno}: {e.message}); "
                         "use generate with a plain prompt instead") from e


def render_chat_template(template: str, messages: list[dict], add_generation_prompt: bool,
                         special_tokens: dict[str, str | None], **extra) -> str:
    """Render ``messages`` (each a dict with at least "role" and "content") through ``template``.

    ``special_tokens`` supplies bos_token, eos_token, ... as the template sees them. A template that calls
    raise_exception (e.g. for roles it does not accept) becomes a ValueError carrying its message.
    """
    if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) for m in messages):
        raise TypeError("messages must be a list of dicts like {'role': 'user', 'content': 'Hi'}")
    for i, m in enumerate(messages):
        if "role" not in m:
            raise ValueError(f"message {i} has no 'role' key; each message needs 'role' and 'content'")
    compiled = compile_chat_template(template)
    try:
        return compiled.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                               **{k: v for k, v in special_tokens.items()}, **extra)
    except jinja2.exceptions.TemplateError as e:
        raise ValueError(f"the model's chat template rejected these messages: {e}") from e
    except (TypeError, ValueError, ArithmeticError, LookupError, AttributeError) as e:
        # A template works on values the caller sent (messages, tools, chat_template_kwargs): their type errors are
        # the request's fault, not the server's.
        raise ValueError(f"the model's chat template failed on these messages: {type(e).__name__}: {e}") from e
