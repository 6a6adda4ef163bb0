"""`kvlab serve` driven by the real `openai` Python client, as editors, agents and notebooks
drive it: the offline Gemma 3 270M, greedy answers equal to `kvlab chat`'s, streaming,
stop strings, a KV cache per request with its bytes back, coded errors, a full queue, eight
concurrent clients, a client that leaves mid-stream, and the server's guards; structured
output (`response_format`, 20 schemas, each answer validated by `jsonschema`); and tools on
the tiny Gemma 4 with its tool vocabulary and published template (a forced call, streamed
and whole, a round trip through a `tool` message, `tool_choice` none and named).

Run by scripts/test.sh (step server-test) in the venv scripts/setup.sh makes:
    KVLAB_BIN=target/debug/kvlab KVLAB_SERVE_MODEL=path/to/model.gguf python test_openai.py
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import time
import unittest

import shutil
import tempfile
from pathlib import Path

import httpx
import jsonschema
import openai

KVLAB = os.environ["KVLAB_BIN"]
MODEL_PATH = os.environ["KVLAB_SERVE_MODEL"]
THREADS = os.environ.get("KVLAB_SERVE_THREADS", "2")
PROMPT = "Name three colours of the sea."


ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "crates/engine/tests/fixtures"


class Server:
    """`kvlab serve` on a free port, stopped at the end."""

    def __init__(self, *args, model=None):
        self.proc = subprocess.Popen(
            [KVLAB, "--threads", THREADS, "serve", "--model", model or MODEL_PATH, "--port", "0",
             *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("kvlab serve: "):
            self.proc.kill()
            raise RuntimeError(f"kvlab serve did not start: {line!r}")
        # "kvlab serve: NAME on http://127.0.0.1:PORT/v1"
        self.model, self.url = line.strip()[len("kvlab serve: "):].rsplit(" on ", 1)

    def client(self, **kw):
        return openai.OpenAI(base_url=self.url, api_key="none", max_retries=0, **kw)

    def stop(self):
        self.proc.stdout.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def kvlab_chat(prompt, tokens):
    out = subprocess.run(
        [KVLAB, "--threads", THREADS, "chat", "--model", MODEL_PATH, "--prompt", prompt,
         "--temp", "0", "--max-tokens", str(tokens)],
        capture_output=True, text=True, check=True,
    )
    # The answer, then one newline.
    return out.stdout[:-1]


class OpenAIClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()
        cls.api = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def ask(self, prompt=PROMPT, tokens=24, **kw):
        return self.api.chat.completions.create(
            model=self.server.model, messages=[{"role": "user", "content": prompt}],
            temperature=0, max_tokens=tokens, **kw)

    def streamed(self, prompt=PROMPT, tokens=24, **kw):
        chunks = list(self.api.chat.completions.create(
            model=self.server.model, messages=[{"role": "user", "content": prompt}],
            temperature=0, max_tokens=tokens, stream=True,
            stream_options={"include_usage": True}, **kw))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks

    def test_models_lists_the_loaded_model(self):
        models = self.api.models.list()
        self.assertEqual([m.id for m in models.data], [self.server.model])

    def test_a_greedy_answer_is_kvlab_chats_and_streams_the_same(self):
        r = self.ask()
        # The offline 270M is a base model: the server and `kvlab chat` both continue the
        # user's text as it is (no template), and the CLI prints that text before the answer.
        self.assertEqual(PROMPT + r.choices[0].message.content, kvlab_chat(PROMPT, 24))
        plain = self.api.completions.create(
            model=self.server.model, prompt=PROMPT, temperature=0, max_tokens=24)
        self.assertEqual(plain.choices[0].text, r.choices[0].message.content)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 24)
        text, chunks = self.streamed()
        self.assertEqual(text, r.choices[0].message.content)
        self.assertEqual(chunks[-1].usage.completion_tokens, 24)
        self.assertEqual(chunks[-1].usage.model_extra["kv_cache"], "f16")

    def test_a_stop_string_ends_the_answer_before_it(self):
        full = self.ask().choices[0].message.content
        words = full.split()
        self.assertGreater(len(words), 3, full)
        stop = words[2]
        r = self.ask(stop=[stop])
        self.assertEqual(r.choices[0].message.content, full[: full.index(stop)])
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_each_request_may_choose_its_cache_and_gets_its_bytes(self):
        f16 = self.ask(extra_body={"kv_cache": "f16"}).usage.model_extra
        tq = self.ask(extra_body={"kv_cache": "tq3.5@all"}).usage.model_extra
        self.assertEqual(f16["kv_cache"], "f16")
        self.assertTrue(tq["kv_cache"].startswith("tq3.5"), tq["kv_cache"])
        # A short chat: TurboQuant holds its first 512 tokens as f16 before it calibrates.
        self.assertEqual(tq["kv_bytes"], f16["kv_bytes"])
        self.assertEqual((tq["kv_calibrating"], f16["kv_calibrating"]), (True, False))
        again = self.ask().usage.model_extra
        self.assertEqual((again["kv_cache"], again["kv_bytes"]), ("f16", f16["kv_bytes"]))
        # Past them, the same tokens at 3.5 bits instead of 16 (plus norms and offsets).
        long = "The sea was calm and the boat drifted on. " * 70
        f16 = self.ask(long, extra_body={"kv_cache": "f16", "conversation": "long-f16"})
        tq = self.ask(long, extra_body={"kv_cache": "tq3.5@all", "conversation": "long-tq"})
        f16, tq = f16.usage.model_extra, tq.usage.model_extra
        self.assertLess(tq["kv_bytes"], f16["kv_bytes"] / 2)
        self.assertGreater(tq["kv_bytes"], 0)
        self.assertFalse(tq["kv_calibrating"])

    def test_errors_are_openai_errors_with_our_codes(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.ask(extra_body={"kv_cache": "tq17"})
        self.assertEqual(e.exception.code, "invalid_request")
        with self.assertRaises(openai.BadRequestError) as e:
            self.ask(prompt="sea " * 40_000)
        self.assertEqual(e.exception.code, "context_overflow")
        with self.assertRaises(openai.NotFoundError) as e:
            self.api.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        self.assertEqual(e.exception.code, "model_not_found")

    def test_a_full_queue_is_429_and_every_other_request_is_answered(self):
        # One long answer holds the engine; two clients (two keys) send 14 short ones each:
        # each client holds at most 8 of the 16 waiting places, the rest are refused.
        def one(tokens, key="none"):
            try:
                api = openai.OpenAI(base_url=self.server.url, api_key=key, max_retries=0)
                return api.chat.completions.create(
                    model=self.server.model, temperature=0, max_tokens=tokens,
                    messages=[{"role": "user", "content": "Tell me about the sea."}],
                ).usage.completion_tokens
            except openai.RateLimitError as e:
                return e.code
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            long = pool.submit(one, 200)
            time.sleep(0.5)
            short = {k: [pool.submit(one, 1, k) for _ in range(14)] for k in ("a", "b")}
            results = {k: [f.result() for f in fs] for k, fs in short.items()}
        self.assertEqual(long.result(), 200)
        every = results["a"] + results["b"]
        self.assertIn("queue_full", every)
        self.assertTrue(all(r in (1, "queue_full") for r in every), results)
        self.assertGreaterEqual(every.count(1), 16)
        for k, rs in results.items():
            self.assertGreaterEqual(rs.count(1), 8, (k, rs))

    def test_eight_concurrent_streams_each_get_their_own_answer(self):
        prompts = [f"Write one sentence about the number {i}." for i in range(8)]
        alone = [self.ask(prompt=p, tokens=12).choices[0].message.content for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda p: self.streamed(prompt=p, tokens=12)[0], prompts))
        self.assertEqual(together, alone)

    def test_a_client_that_leaves_mid_stream_frees_the_engine(self):
        body = {"model": self.server.model, "messages": [{"role": "user", "content": PROMPT}],
                "temperature": 0, "max_tokens": 2000, "stream": True}
        with httpx.stream("POST", f"{self.server.url}/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and "content" in line:
                    break
        # The connection is closed; the engine stops within a token or two.
        deadline = time.time() + 10
        while time.time() < deadline:
            kv = httpx.get(f"{self.server.url}/kv").json()
            if not kv["busy"]:
                break
            time.sleep(0.1)
        self.assertFalse(kv["busy"])
        self.assertLess(kv["now"]["tokens_in_context"], 1000)

    def test_the_server_refuses_foreign_hosts_and_oversized_bodies(self):
        r = httpx.get(f"{self.server.url}/models", headers={"Host": "evil.example"})
        self.assertEqual((r.status_code, r.json()["error"]["code"]), (403, "forbidden_host"))
        r = httpx.post(f"{self.server.url}/chat/completions", content=b"x" * (9 << 20),
                       headers={"Content-Type": "application/json"})
        self.assertEqual(r.status_code, 413)

    def test_metrics_count_requests_and_kv_bytes(self):
        self.ask(tokens=2)
        text = httpx.get(self.server.url.replace("/v1", "/metrics")).text
        self.assertIn('kvlab_requests_total{endpoint="chat"}', text)
        self.assertIn("kvlab_kv_bytes_total", text)


# Schemas of the kinds agent clients send in strict mode (none tuned to this model: every
# object closed by additionalProperties false, as OpenAI's strict mode requires): every
# answer must parse and validate. Strings and lists are bounded where a client would bound
# them (a base model left free writes keys and words without end, and so would any model
# at max_tokens).
SCHEMAS = [
    {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 20}}, "required": ["colour"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"], "additionalProperties": False},
    {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}}, "required": ["sentiment"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 5},
    {"type": "object", "properties": {"colours": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 12}}}, "required": ["colours"], "additionalProperties": False},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "location": {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90}, "lon": {"type": "number", "minimum": -180, "maximum": 180}}, "required": ["lat", "lon"], "additionalProperties": False}}, "required": ["city", "location"], "additionalProperties": False},
    {"type": "object", "properties": {"priority": {"type": "integer", "enum": [1, 2, 3]}, "done": {"type": "boolean"}}, "required": ["priority", "done"], "additionalProperties": False},
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 30}, "tags": {"type": "array", "maxItems": 4, "items": {"enum": ["sea", "sky", "sand", "sun"]}}}, "required": ["title", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 20}}, "required": ["note"], "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"const": "colour"}, "value": {"type": "string", "maxLength": 10}}, "required": ["kind", "value"], "additionalProperties": False},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["score"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "qty": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["name", "qty"], "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}}, "required": ["email"], "additionalProperties": False},
    {"type": "object", "properties": {"when": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}}, "required": ["when"], "additionalProperties": False},
    {"anyOf": [{"type": "object", "properties": {"yes": {"type": "boolean"}}, "required": ["yes"], "additionalProperties": False}, {"type": "object", "properties": {"no": {"type": "integer"}}, "required": ["no"], "additionalProperties": False}]},
    {"$defs": {"colour": {"enum": ["blue", "green", "grey"]}}, "type": "object", "properties": {"sea": {"$ref": "#/$defs/colour"}, "sky": {"$ref": "#/$defs/colour"}}, "required": ["sea", "sky"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}, "required": ["a"], "additionalProperties": False},
    {"type": "string", "maxLength": 16},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "items": {"type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}}, "required": ["matrix"], "additionalProperties": False},
]


class StructuredOutput(unittest.TestCase):
    """`response_format` on the 270M: every answer parses and validates."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server()
        cls.api = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def answer(self, fmt, prompt="Describe the sea as JSON.", tokens=400, **kw):
        r = self.api.chat.completions.create(
            model=self.server.model, messages=[{"role": "user", "content": prompt}],
            temperature=0, max_tokens=tokens, response_format=fmt, **kw)
        self.assertEqual(r.choices[0].finish_reason, "stop", r.choices[0].message.content)
        return json.loads(r.choices[0].message.content)

    def test_every_answer_under_a_schema_validates(self):
        for i, schema in enumerate(SCHEMAS):
            with self.subTest(schema=i):
                fmt = {"type": "json_schema",
                       "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
                jsonschema.validate(self.answer(fmt), schema)

    def test_json_object_streams_and_holds_under_every_cache(self):
        # Any object: this base model may go on adding keys to max_tokens; what it wrote is
        # then an object still open, and a whole one when it stops.
        r = self.api.chat.completions.create(
            model=self.server.model, temperature=0, max_tokens=80,
            messages=[{"role": "user", "content": "The sea, as JSON:"}],
            response_format={"type": "json_object"})
        text = r.choices[0].message.content
        if r.choices[0].finish_reason == "stop":
            self.assertIsInstance(json.loads(text), dict)
        else:
            self.assertTrue(text.startswith("{"), text)
        schema = SCHEMAS[1]
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
        for cache in ("q8_0", "q4_0+sink", "tq3.5@all", "k4v3+qw@all"):
            with self.subTest(cache=cache):
                got = self.answer(fmt, extra_body={"kv_cache": cache})
                jsonschema.validate(got, schema)
        chunks = list(self.api.chat.completions.create(
            model=self.server.model, messages=[{"role": "user", "content": "A person."}],
            temperature=0, max_tokens=200, response_format=fmt, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        jsonschema.validate(json.loads(text), schema)

    def test_bad_schemas_and_tools_without_a_template_are_clear_400s(self):
        deep = {"type": "integer"}
        for _ in range(600):
            deep = {"type": "array", "items": deep}
        unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
        for fmt in ({"type": "json_schema", "json_schema": {"name": "x", "schema": deep}},
                    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"pattern": "(("}}},
                    # A keyword the grammar cannot hold is refused by name, not ignored.
                    {"type": "json_schema", "json_schema": {"name": "x", "schema": unique}},
                    {"type": "yaml"}):
            with self.assertRaises(openai.BadRequestError) as e:
                self.answer(fmt)
            self.assertEqual(e.exception.code, "invalid_request")
        with self.assertRaises(openai.BadRequestError) as e:
            self.api.chat.completions.create(
                model=self.server.model, messages=[{"role": "user", "content": "hi"}],
                tools=[WEATHER], tool_choice="required")
        self.assertEqual(e.exception.code, "invalid_request")
        self.assertIn("Gemma 3 models have no tool-call syntax", e.exception.message)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit"]}}}
PING = {"type": "function", "function": {"name": "ping", "description": "Check the line.",
                                         "parameters": {"type": "object", "properties": {}}}}


def tiny_gemma4(folder):
    """The tiny random-weight Gemma 4 E-model with the published Jul 14 template and a
    vocabulary that has Gemma 4's tool tokens (the engine's tools tests use the same)."""
    src = FIXTURES / "tiny_e"
    shutil.copy(src / "model.safetensors", folder / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    # A tool's declaration is some hundreds of tokens in this tiny vocabulary.
    config["max_position_embeddings"] = 2048
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(FIXTURES / "templates/g4_e2b_jul14.jinja", folder / "chat_template.jinja")
    return folder / "model.safetensors", src / "tokenizer_tools.json"


class Tools(unittest.TestCase):
    """Tools through the openai client on the tiny Gemma 4: random weights, so only a forced
    call is meaningful, and the grammar makes it well formed."""

    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.TemporaryDirectory()
        model, tokenizer = tiny_gemma4(Path(cls.folder.name))
        cls.server = Server("--tokenizer", str(tokenizer), model=str(model))
        cls.api = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.folder.cleanup()

    def ask(self, messages, max_tokens=120, **kw):
        return self.api.chat.completions.create(
            model=self.server.model, messages=messages, temperature=0, max_tokens=max_tokens,
            **kw)

    def check_call(self, call, allowed=("get_weather", "ping")):
        self.assertIn(call.function.name, allowed)
        args = json.loads(call.function.arguments)
        tool = WEATHER if call.function.name == "get_weather" else PING
        jsonschema.validate(args, tool["function"]["parameters"])
        self.assertTrue(call.id.startswith("call_"), call.id)
        return args

    def test_a_required_call_is_whole_and_streamed_alike(self):
        question = [{"role": "user", "content": "Weather in Paris?"}]
        r = self.ask(question, tools=[WEATHER, PING], tool_choice="required",
                     parallel_tool_calls=False)
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        self.assertEqual(len(choice.message.tool_calls), 1)
        args = self.check_call(choice.message.tool_calls[0])
        # Streamed: the id and name first, then the arguments; reassembled, the same call.
        chunks = list(self.api.chat.completions.create(
            model=self.server.model, messages=question, temperature=0, max_tokens=120,
            tools=[WEATHER, PING], tool_choice="required", parallel_tool_calls=False,
            stream=True))
        calls = {}
        for c in chunks:
            for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
                got = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                got["id"] = d.id or got["id"]
                if d.function and d.function.name:
                    got["name"] = d.function.name
                if d.function and d.function.arguments:
                    got["arguments"] += d.function.arguments
        self.assertEqual(chunks[-1].choices[0].finish_reason, "tool_calls")
        self.assertEqual(list(calls), [0])
        self.assertEqual(calls[0]["name"], choice.message.tool_calls[0].function.name)
        self.assertEqual(json.loads(calls[0]["arguments"]), args)

    def test_a_named_function_and_a_round_trip(self):
        question = [{"role": "user", "content": "Weather in Paris?"}]
        r = self.ask(question, tools=[WEATHER, PING],
                     tool_choice={"type": "function", "function": {"name": "get_weather"}})
        call = r.choices[0].message.tool_calls[0]
        self.check_call(call, allowed=("get_weather",))
        # The tool answers; the model goes on in text (random weights: any text).
        follow = question + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
        ]
        final = self.ask(follow, tools=[WEATHER, PING], max_tokens=8)
        self.assertIn(final.choices[0].finish_reason, ("stop", "length", "tool_calls"))

    def test_tool_choice_none_answers_in_text(self):
        r = self.ask([{"role": "user", "content": "Hi"}], tools=[WEATHER], tool_choice="none",
                     max_tokens=16)
        self.assertIsNone(r.choices[0].message.tool_calls)
        self.assertIsInstance(r.choices[0].message.content, str)
        with self.assertRaises(openai.BadRequestError):
            self.ask([{"role": "user", "content": "Hi"}], tools=[WEATHER],
                     tool_choice={"type": "function", "function": {"name": "nope"}})


class ApiKey(unittest.TestCase):
    def test_a_key_is_required_when_set(self):
        server = Server("--api-key", "s3cret")
        try:
            with self.assertRaises(openai.AuthenticationError):
                server.client().models.list()
            ok = openai.OpenAI(base_url=server.url, api_key="s3cret", max_retries=0)
            self.assertEqual(len(ok.models.list().data), 1)
        finally:
            server.stop()

    def test_binding_beyond_loopback_without_a_key_is_refused(self):
        out = subprocess.run([KVLAB, "serve", "--model", MODEL_PATH, "--host", "0.0.0.0", "--port", "0"],
                             capture_output=True, text=True, timeout=60)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("needs an API key", out.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
