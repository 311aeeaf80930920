"""A small OpenAI-compatible HTTP/1.1 server on asyncio streams (Python stdlib only).

  GET  /health, /v1/models, /get_model_info, /metrics (JSON engine counters)
  POST /v1/completions        prompt: a string or a list of token ids
  POST /v1/chat/completions   messages: [{"role", "content": string}]
Both with `stream` (SSE, chunked transfer encoding so keep-alive works), `stream_options.
include_usage`, `max_tokens`, `ignore_eos`, `temperature`; `return_token_ids` adds the ids
to each choice (vLLM's name). Bad requests get a 4xx with OpenAI's error JSON.

Text is a trivial byte tokenizer: a string prompt is its UTF-8 bytes (ids 0-255); an output id
below 256 is the Latin-1 character of that byte, any other id the text "<|id|>", so every token
has non-empty text (load generators count a chunk with text as a token).
"""
import asyncio
import json
import time
import uuid

from engine import Request, RequestError

MAX_BODY = 64 << 20
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 411: "Length Required",
           413: "Payload Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


class ApiError(Exception):
    def __init__(self, status, message, param=None, code=None, kind="invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self):
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def token_text(t: int) -> str:
    return chr(t) if t < 256 else f"<|{t}|>"


def encode_text(s: str) -> list:
    return list(s.encode("utf-8"))


def render_chat(messages) -> str:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty array", "messages")
    out = ""
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ApiError(400, "each message needs a string role and a string content", "messages")
        out += f"<|{m['role']}|>\n{m['content']}\n"
    return out + "<|assistant|>\n"


def parse_generation(body: dict, chat: bool, served_name: str):
    """The request body -> (Request, options dict); ApiError on anything invalid or unsupported."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    model = body.get("model")
    if model not in (None, "", served_name):
        raise ApiError(404, f"The model '{model}' does not exist (this server serves '{served_name}')", "model",
                       "model_not_found")
    if chat:
        prompt = encode_text(render_chat(body.get("messages")))
    else:
        p = body.get("prompt")
        if isinstance(p, str):
            prompt = encode_text(p)
        elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            prompt = list(p)
        elif isinstance(p, list) and len(p) == 1 and (isinstance(p[0], str) or isinstance(p[0], list)):
            return parse_generation(dict(body, prompt=p[0]), chat, served_name)
        else:
            raise ApiError(400, "prompt must be a string or a non-empty array of token ids (one prompt per request)",
                           "prompt")
    max_key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = body.get(max_key, 16 if not chat else None)
    if max_tokens is None:
        max_tokens = 16
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ApiError(400, f"{max_key} must be a positive integer", max_key)
    temperature = body.get("temperature")
    if temperature is None:
        temperature = 1.0  # OpenAI's default
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 <= temperature <= 2:
        raise ApiError(400, "temperature must be a number in [0, 2]", "temperature")
    for key, ok in (("n", lambda v: v in (None, 1)), ("stop", lambda v: not v), ("logprobs", lambda v: not v),
                    ("echo", lambda v: not v), ("best_of", lambda v: v in (None, 1)), ("tools", lambda v: not v)):
        if key in body and not ok(body[key]):
            raise ApiError(400, f"{key} is not supported by this baseline", key)
    for key in ("stream", "ignore_eos", "return_token_ids"):
        if key in body and not isinstance(body[key], bool):
            raise ApiError(400, f"{key} must be a boolean", key)
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    r = Request(prompt=prompt, max_tokens=max_tokens, ignore_eos=bool(body.get("ignore_eos", False)),
                temperature=float(temperature))
    opts = {"stream": bool(body.get("stream", False)), "usage": bool(so.get("include_usage", False)),
            "token_ids": bool(body.get("return_token_ids", False))}
    return r, opts


class Server:
    def __init__(self, engine, served_name: str, model_path: str):
        self.engine, self.name, self.model_path = engine, served_name, model_path
        self.loop = None
        engine.on_tokens = self._from_engine

    # -- engine thread -> event loop ----------------------------------------------------------
    def _from_engine(self, events):
        self.loop.call_soon_threadsafe(self._dispatch, events)

    @staticmethod
    def _dispatch(events):
        for r, token, reason in events:
            r.context.put_nowait((token, reason))

    # -- connections ------------------------------------------------------------------------
    async def serve(self, host: str, port: int, ready=None):
        self.loop = asyncio.get_running_loop()
        server = await asyncio.start_server(self._connection, host, port, limit=1 << 20, backlog=4096)
        if ready:
            ready(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    async def _connection(self, reader, writer):
        try:
            while True:
                try:
                    line = await reader.readline()
                except (ConnectionError, asyncio.LimitOverrunError, ValueError):
                    return
                if not line:
                    return
                try:
                    method, path, version = line.decode("latin-1").strip().split(" ", 2)
                except ValueError:
                    await self._send_json(writer, 400, ApiError(400, "malformed request line").body(), close=True)
                    return
                headers = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                keep = headers.get("connection", "").lower() != "close" and version.strip() == "HTTP/1.1"
                body = b""
                if method == "POST":
                    if "chunked" in headers.get("transfer-encoding", "").lower():
                        await self._send_json(writer, 411, ApiError(411, "send the body with Content-Length").body(), True)
                        return
                    try:
                        n = int(headers.get("content-length", "0"))
                    except ValueError:
                        n = -1
                    if not 0 <= n <= MAX_BODY:
                        await self._send_json(writer, 413, ApiError(413, "bad or too large Content-Length").body(), True)
                        return
                    body = await reader.readexactly(n)
                if not await self._handle(method, path.split("?", 1)[0], body, writer, keep):
                    return
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def _send_json(self, writer, status, obj, close=False):
        data = json.dumps(obj).encode()
        head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n")
        writer.write(head.encode() + data)
        await writer.drain()

    async def _handle(self, method, path, body, writer, keep) -> bool:
        """Answers one request; False when the connection must close."""
        gets = {"/health": self._health, "/v1/models": self._models, "/get_model_info": self._model_info,
                "/metrics": self._metrics}
        posts = {"/v1/completions": False, "/v1/chat/completions": True}
        if path in gets or path in posts:
            if (method == "GET") != (path in gets):
                await self._send_json(writer, 405, ApiError(405, f"{method} {path} is not allowed").body(), not keep)
                return keep
        else:
            await self._send_json(writer, 404, ApiError(404, f"no route {path}").body(), not keep)
            return keep
        if path in gets:
            status, obj = gets[path]()
            await self._send_json(writer, status, obj, not keep)
            return keep
        try:
            try:
                parsed = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ApiError(400, f"the body is not valid JSON: {e}") from None
            r, opts = parse_generation(parsed, posts[path], self.name)
            r.context = asyncio.Queue()
            try:
                self.engine.submit(r)
            except RequestError as e:
                raise ApiError(400, str(e), "prompt" if "prompt" in str(e) else None) from None
        except ApiError as e:
            await self._send_json(writer, e.status, e.body(), not keep)
            return keep
        try:
            if opts["stream"]:
                return await self._stream(r, opts, posts[path], writer, keep)
            return await self._whole(r, opts, posts[path], writer, keep)
        finally:
            r.cancelled = r.finish_reason is None  # a client gone mid-request frees its pages

    def _health(self):
        if self.engine.error or not self.engine.thread.is_alive():
            return 503, ApiError(503, f"engine stopped: {self.engine.error}", kind="server_error").body()
        return 200, {"status": "ok"}

    def _models(self):
        return 200, {"object": "list", "data": [{"id": self.name, "object": "model", "created": 0, "owned_by": "torch_serve",
                                                 "max_model_len": self.engine.model.cfg.max_context}]}

    def _model_info(self):
        cfg = self.engine.model.cfg
        return 200, {"model_path": self.model_path, "served_model_name": self.name, "vocab_size": cfg.vocab,
                     "max_context": cfg.max_context, "backend": "torch_serve"}

    def _metrics(self):
        s, e = self.engine.stats, self.engine
        return 200, dict(vars(s), running=len(e.running), waiting=len(e.waiting), free_pages=len(e.kv.free_pages),
                         pages=e.kv.num_pages)

    async def _events(self, r):
        """(token, finish_reason) pairs until the request ends."""
        while True:
            token, reason = await r.context.get()
            if reason == "error":
                raise ApiError(500, f"the engine failed: {self.engine.error}", kind="server_error")
            yield token, reason
            if reason:
                return

    def _usage(self, r):
        return {"prompt_tokens": len(r.prompt), "completion_tokens": len(r.output),
                "total_tokens": len(r.prompt) + len(r.output)}

    async def _whole(self, r, opts, chat, writer, keep) -> bool:
        ids = []
        try:
            async for token, reason in self._events(r):
                if token is not None:
                    ids.append(token)
        except ApiError as e:
            await self._send_json(writer, e.status, e.body(), not keep)
            return keep
        text = "".join(token_text(t) for t in ids)
        choice = {"index": 0, "finish_reason": r.finish_reason, "logprobs": None}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        if opts["token_ids"]:
            choice["token_ids"] = ids
        obj = {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex, "created": int(time.time()),
               "object": "chat.completion" if chat else "text_completion", "model": self.name,
               "choices": [choice], "usage": self._usage(r)}
        await self._send_json(writer, 200, obj, not keep)
        return keep

    async def _stream(self, r, opts, chat, writer, keep) -> bool:
        head = ("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                "Transfer-Encoding: chunked\r\n" + ("" if keep else "Connection: close\r\n") + "\r\n")
        writer.write(head.encode())
        rid, created = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex, int(time.time())
        obj_name = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices, **extra):
            return {"id": rid, "object": obj_name, "created": created, "model": self.name, "choices": choices, **extra}

        async def send(obj):
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()

        try:
            if chat:
                await send(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]))
            async for token, reason in self._events(r):
                c = {"index": 0, "finish_reason": reason, "logprobs": None}
                text = token_text(token) if token is not None else ""
                c.update({"delta": {"content": text} if text else {}} if chat else {"text": text})
                if opts["token_ids"]:
                    c["token_ids"] = [] if token is None else [token]
                await send(chunk([c]))
        except ApiError as e:
            await send(e.body())
        if opts["usage"]:
            await send(chunk([], usage=self._usage(r)))
        await send(b"[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return keep
