"""An OpenAI-compatible chat endpoint over llama.cpp that parses no tool calls, for measuring `--llm-url`.

llama.cpp's own server is not built here (llama-cpp-python ships only the library, and its
`llama_cpp.server` needs packages this venv lacks). This stands in for a server that did not parse what
its model wrote: the prompt is the model's chat template with the offered tools (as llama.cpp's server
renders it with `--jinja`), and the reply comes back as streamed `delta.content` only, whatever the
model wrote. Greedy, without a repetition penalty (the server's `temperature: 0`).

    .venv/bin/python -m tests.llamacpp_endpoint --port 8091 [--model qwen2.5-0.5b]
    .venv/bin/parley bench tools --llm-url http://127.0.0.1:8091/v1
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from parley.config import Settings
from parley.engines.cache import llm_gguf
from parley.engines.llm import ChatTokenizer


class LlamaCppEndpoint:
    """The model, its chat template, and one reply at a time."""

    def __init__(self, model: str, threads: int = 2) -> None:
        import llama_cpp

        gguf, tokenizer = llm_gguf(Settings().resolved_cache_dir(), model)
        self.chat = ChatTokenizer(tokenizer)
        self.llm = llama_cpp.Llama(str(gguf), n_ctx=4096, n_threads=threads, verbose=False)
        self.lock = threading.Lock()

    def pieces(self, request: dict[str, Any]) -> list[str]:
        prompt = self.chat.prompt_ids(request["messages"], request.get("tools") or None)
        with self.lock:
            chunks = self.llm.create_completion(
                prompt,
                max_tokens=int(request.get("max_tokens") or 96),
                temperature=float(request.get("temperature") or 0.0),
                repeat_penalty=1.0,
                stream=True,
            )
            return [str(chunk["choices"][0]["text"]) for chunk in chunks]


def handler(endpoint: LlamaCppEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for piece in endpoint.pieces(request):
                if piece:
                    self._event({"content": piece})
            self.wfile.write(b"data: [DONE]\n\n")

        def _event(self, delta: dict[str, Any]) -> None:
            self.wfile.write(f"data: {json.dumps({'choices': [{'index': 0, 'delta': delta}]})}\n\n".encode())
            self.wfile.flush()

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8091)
    parser.add_argument("--model", default=Settings().local_llm())
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(LlamaCppEndpoint(args.model)))
    print(f"listening on http://127.0.0.1:{args.port}/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
