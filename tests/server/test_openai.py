"""`kvlab serve` driven by the real `openai` Python client, as editors, agents and notebooks
drive it: the offline Gemma 3 270M, greedy answers equal to `kvlab chat`'s, streaming,
stop strings, a KV cache per request with its bytes back, coded errors, a full queue, eight
concurrent clients, a client that leaves mid-stream, and the server's guards.

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

import httpx
import openai

KVLAB = os.environ["KVLAB_BIN"]
MODEL_PATH = os.environ["KVLAB_SERVE_MODEL"]
THREADS = os.environ.get("KVLAB_SERVE_THREADS", "2")
PROMPT = "Name three colours of the sea."


class Server:
    """`kvlab serve` on a free port, stopped at the end."""

    def __init__(self, *args):
        self.proc = subprocess.Popen(
            [KVLAB, "--threads", THREADS, "serve", "--model", MODEL_PATH, "--port", "0", *args],
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
