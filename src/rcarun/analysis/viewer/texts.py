"""The viewer's text files: each prompt, answer, reasoning text, raw body and method output written once as a
small script, loaded by a page only when a person asks to read it.

Why scripts: a page opened from ``file://`` may not ``fetch`` a sibling file (Chromium refuses), but it may add
a ``<script src>``. Each file calls ``rcarunText(key, text)``; the text is a JSON string with every non-ASCII
character escaped, so the file reads the same whatever charset the browser assumes, and no text is ever parsed
as HTML (the page puts it in with ``textContent``).

Keys are ``<kind>-<sha256>``: the kind says how the text was made from the blob (or the output) that the hash
names, so one blob read two ways (a raw body, and the answer in it) gives two files, and a text shared by many
calls (the same prompt across realizations) gives one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final

from rcarun.backends import get_preset, parse_completion
from rcarun.errors import RcarunError
from rcarun.store import Store

__all__ = ["TextFiles", "prompt_text", "text_path"]

KIND_PROMPT: Final = "p"  # the canonical request, rendered as its messages
KIND_ANSWER: Final = "a"  # the answer's content, read from the raw body with the backbone's preset
KIND_REASONING: Final = "r"  # the thinking text, read from the raw body
KIND_BODY: Final = "b"  # a raw response body as received, when the preset reads no answer from it
KIND_TEXT: Final = "t"  # a text blob as stored (answer or thinking text kept apart from a body)
KIND_OUTPUT: Final = "o"  # a prediction's output JSON, indented


def text_path(key: str) -> str:
    """Where the file of ``key`` lies, relative to the site's root (the page script builds the same path)."""
    return f"texts/{key[2:4]}/{key}.js"


def _message_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones, name the others
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(json.dumps(part, ensure_ascii=False))
        return "\n".join(parts)
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def prompt_text(request_json: bytes) -> str:
    """A canonical request as a person reads it: its settings, then each message under its role, then the
    answer schema; the stored text as is when it is not a request object."""
    try:
        request = json.loads(request_json)
    except ValueError:
        return request_json.decode("utf-8", errors="replace")
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        return json.dumps(request, ensure_ascii=False, indent=2)
    settings = {
        k: v for k, v in request.items() if k not in ("messages", "schema", "tools") and v is not None
    }
    lines = ["settings: " + json.dumps(settings, ensure_ascii=False, sort_keys=True)]
    for message in request["messages"]:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role", "?"))
        if message.get("tool_call_id"):
            role += f" (answers {message['tool_call_id']})"
        lines += ["", f"── {role} ──", _message_text(message.get("content"))]
        for call in message.get("tool_calls") or ():
            lines.append("→ tool call " + json.dumps(call, ensure_ascii=False))
    for key in ("tools", "schema"):
        if request.get(key):
            lines += ["", f"── {key} ──", json.dumps(request[key], ensure_ascii=False, indent=2)]
    return "\n".join(lines)


class TextFiles:
    """Writes text files under ``root/texts``, each key once; tells a page which keys a call has."""

    def __init__(self, root: Path, store: Store, providers: dict[str, str]) -> None:
        """
        Args:
            root: the site's folder.
            store: results.db, for the blobs.
            providers: each backbone's provider preset name, to read its raw bodies as the backend did.
        """
        self._root = root
        self._store = store
        self._providers = providers
        self._written: set[str] = set()
        self.bytes_written = 0

    @property
    def count(self) -> int:
        return len(self._written)

    def _write(self, key: str, text: str) -> str:
        if key not in self._written:
            path = self._root / text_path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            body = f"rcarunText({json.dumps(key)}, {json.dumps(text, ensure_ascii=True)});\n"
            path.write_text(body, encoding="ascii")
            self._written.add(key)
            self.bytes_written += len(body)
        return key

    def _blob(self, sha256: str) -> bytes | None:
        try:
            return self._store.read_blob(sha256)
        except RcarunError:
            return None

    def _missing(self, key: str, sha256: str) -> str:
        return self._write(key, f"(blob {sha256} is missing from results.db or corrupt)")

    def prompt(self, sha256: str) -> str:
        key = f"{KIND_PROMPT}-{sha256}"
        if key in self._written:
            return key
        data = self._blob(sha256)
        return self._missing(key, sha256) if data is None else self._write(key, prompt_text(data))

    def text(self, sha256: str) -> str:
        key = f"{KIND_TEXT}-{sha256}"
        if key in self._written:
            return key
        data = self._blob(sha256)
        if data is None:
            return self._missing(key, sha256)
        return self._write(key, data.decode("utf-8", errors="replace"))

    def body(self, sha256: str, backbone: str) -> dict[str, str]:
        """The keys of what a raw body holds, read with the backbone's preset: ``answer`` and, when there is
        one, ``reasoning``; a body the preset cannot read (an error body, a malformed one) is kept as ``raw``.

        The raw body of a readable answer is left out: it repeats the answer and reasoning texts, and was 30 %
        of the demo site's text bytes.
        """
        answer_key, reasoning_key = f"{KIND_ANSWER}-{sha256}", f"{KIND_REASONING}-{sha256}"
        raw_key = f"{KIND_BODY}-{sha256}"
        if answer_key in self._written:
            return {"answer": answer_key} | (
                {"reasoning": reasoning_key} if reasoning_key in self._written else {}
            )
        if raw_key in self._written:
            return {"raw": raw_key}
        data = self._blob(sha256)
        if data is None:
            return {"raw": self._missing(raw_key, sha256)}
        provider = self._providers.get(backbone, "openai-compatible")
        try:
            result = parse_completion(200, {}, data, get_preset(provider), 0.0, "", backbone=backbone)
        except (RcarunError, KeyError, ValueError):
            return {"raw": self._write(raw_key, data.decode("utf-8", errors="replace"))}
        answer = result.text
        for call in result.tool_calls:
            answer += f"\n→ tool call {call.name}({call.arguments})"
        found = {"answer": self._write(answer_key, answer)}
        if result.reasoning_text:
            found["reasoning"] = self._write(reasoning_key, result.reasoning_text)
        return found

    def output(self, output: dict[str, Any]) -> str:
        text = json.dumps(output, ensure_ascii=False, indent=2, sort_keys=True)
        key = f"{KIND_OUTPUT}-{hashlib.sha256(text.encode()).hexdigest()}"
        return self._write(key, text)
