"""What a chat request's ``tools`` / ``tool_choice`` mean for the prompt, the sampling and the output.

- none (or no tools): the tools are not shown to the model, its output is content.
- auto (the default with tools): the chat template shows the tools and the server's --tool-call-parser reads the
  calls the model writes in its own format.
- required / a named function: the output is constrained by the grammar library to JSON, whatever the model's own
  format (a named function's arguments object; for required, an array of {"name", "parameters"} objects, one item
  unless parallel_tool_calls), and returned as tool calls.
"""

from __future__ import annotations

from .chat_output import OutputParsing

ANY_OBJECT = {"type": "object"}


class ToolChoiceError(ValueError):
    """The request's tools cannot be served as asked; the message says why and what to send instead."""


def mode(req) -> str:
    """ "none", "auto", "required" or the name of the function tool_choice names."""
    choice = req.tool_choice
    if not req.tools:
        return "none"
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.function.name


def template_tools(req) -> list[dict] | None:
    """The tools as chat templates take them (Hugging Face's convention: OpenAI's tool objects), or None."""
    if mode(req) == "none":
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]


def parameters(tool) -> dict:
    return tool.function.parameters or ANY_OBJECT


def forced_schema(req) -> dict | None:
    """The JSON schema that tool_choice required / named imposes on the output, or None."""
    m = mode(req)
    if m in ("none", "auto"):
        return None
    if m != "required":
        return parameters(next(t for t in req.tools if t.function.name == m))
    items = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.function.name}, "parameters":
                                                             parameters(t)},
                        "required": ["name", "parameters"], "additionalProperties": False} for t in req.tools]}
    schema = {"type": "array", "items": items, "minItems": 1}
    if not req.parallel_tool_calls:
        schema["maxItems"] = 1
    return schema


def output_parsing(req, reasoning_parser, tool_parser) -> OutputParsing:
    """How the request's output is read, given the server's --reasoning-parser and --tool-call-parser factories
    (None where not set). ToolChoiceError for auto tool choice on a server with no tool-call parser."""
    m = mode(req)
    if m == "auto" and tool_parser is None:
        raise ToolChoiceError("tool_choice 'auto' (the default when tools are sent) reads the calls a model writes in "
                              "its own format: start the server with --tool-call-parser (hermes for Qwen 2.5/3, "
                              "llama3_json, mistral), or send tool_choice 'required' or a named function")
    forced = m not in ("none", "auto")
    if forced and req.response_format is not None and req.response_format.type != "text":
        raise ToolChoiceError("response_format and tool_choice 'required' or a named function both constrain the "
                              "output; send one of them")
    return OutputParsing(reasoning=reasoning_parser, tools=tool_parser if m == "auto" else None,
                         forced=m if forced else None)
