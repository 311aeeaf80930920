#!/usr/bin/env python3
"""Structured output end to end (issue 42): `fp4moe serve --backend fake --fake-uniform-logits`
(every allowed token equally likely, so outputs wander through the whole grammar) answers 200+
constrained requests; every output that finishes with "stop" validates (Python's `jsonschema`
for JSON schemas, `re.fullmatch` for regexes), every "length" output used all its tokens.
Through the real `openai` client: response_format json_schema / json_object and SGLang's
regex / ebnf / json_schema as extra_body; through /generate: sampling_params.json_schema /
regex / ebnf. Bad grammars are a 400 with an OpenAI error JSON and the server stays healthy.

Then `RealModel`: a toy GLM-5 (make-synthetic glm5-tiny, random weights) with a real tokenizer
behind `--backend cpu` (CI) or the backend named on the command line (`--backend cuda`, the
device step tools/device/steps/60_serve.sh): grammars with finite languages finish with "stop"
and validate in greedy and every sampling mode, and a batch of concurrent constrained and
unconstrained requests gives each its output alone (the masks reach their own rows).
`RealModelSpeculative` (CPU only): the same with `--speculative-algorithm NEXTN`, and greedy
constrained output equal to the server's without it.

    structured_output_e2e_test.py PATH/TO/fp4moe                   # fake + cpu (CI)
    structured_output_e2e_test.py PATH/TO/fp4moe --backend cuda    # RealModel on the GPU runner only
"""
import concurrent.futures as cf
import json
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openai_e2e_test as e2e  # noqa: E402  (ServerProcess)
import structured_output_cases as cases  # noqa: E402

# `--backend NAME` (after the binary): only RealModel, on that backend.
REAL_BACKEND = "cpu"
if len(sys.argv) > 3 and sys.argv[2] == "--backend":
    REAL_BACKEND = sys.argv[3]
    del sys.argv[2:4]
    sys.argv.append("RealModel")

try:
    import jsonschema
except ImportError:  # setup.sh --deps installs it; RealModel's finite languages are checked by hand
    if "RealModel" not in sys.argv:
        sys.exit("jsonschema is not installed (setup.sh --deps installs the pinned version): this test needs it")
    jsonschema = None

MAX_TOKENS = 1500
MESSAGES = [{"role": "user", "content": "answer in the requested format"}]


class StructuredOutput(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = e2e.ServerProcess("--fake-uniform-logits", "--max-running-requests", "16",
                                       "--served-model-name", "m")
        cls.client = cls.server.client()
        cls.schemas, cls.regexes, cls.ebnfs = cases.corpus()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def generate(self, sampling, seed):
        sp = {"max_new_tokens": MAX_TOKENS, "temperature": 1.0, "sampling_seed": seed}
        sp.update(sampling)
        status, body = self.server.json("POST", "/generate", {"text": "x", "sampling_params": sp})
        self.assertEqual(status, 200, body)
        return body["text"], body["meta_info"]["finish_reason"]["type"], body["meta_info"]["completion_tokens"]

    def chat(self, seed, **kw):
        r = self.client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=1.0,
                                                seed=seed, **kw)
        c = r.choices[0]
        return c.message.content or "", c.finish_reason, r.usage.completion_tokens

    def run_all(self, jobs):
        """jobs: [(label, fn, check)]; fn() -> (text, finish, tokens); check(text) raises on a bad output."""
        stops = lengths = 0
        with cf.ThreadPoolExecutor(8) as pool:
            futures = [(label, pool.submit(fn), check) for label, fn, check in jobs]
            for label, fut, check in futures:
                text, finish, tokens = fut.result()
                if finish == "stop":
                    stops += 1
                    try:
                        check(text)
                    except Exception as e:  # noqa: BLE001  (the failure names the case)
                        self.fail(f"{label}: {text!r} does not validate: {e}")
                else:
                    self.assertEqual(finish, "length", f"{label}: {finish}")
                    self.assertEqual(tokens, MAX_TOKENS, label)
                    lengths += 1
        return stops, lengths

    def test_schemas_regexes_and_grammars_validate(self):
        jobs = []
        for i, schema in enumerate(self.schemas):
            def check(text, schema=schema):
                jsonschema.validate(json.loads(text), schema)
            text = json.dumps(schema)
            if i % 3 == 0:
                fn = lambda text=text, i=i: self.generate({"json_schema": text}, i)  # noqa: E731
            elif i % 3 == 1:
                rf = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
                fn = lambda rf=rf, i=i: self.chat(i, response_format=rf)  # noqa: E731
            else:
                fn = lambda text=text, i=i: self.chat(i, extra_body={"json_schema": text})  # noqa: E731
            jobs.append((f"schema {i} {text[:80]}", fn, check))
        for i, rx in enumerate(self.regexes):
            def check(text, rx=rx):
                # The engine's regexes are ECMA-262's (JSON Schema's dialect): \s includes U+FEFF,
                # which Python's \s does not; validate with ECMA's class (\s outside [] only here).
                ecma_s = "[\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
                assert re.fullmatch(rx.replace(r"\s", ecma_s), text), "no full match"
            if i % 2:
                fn = lambda rx=rx, i=i: self.generate({"regex": rx}, 1000 + i)  # noqa: E731
            else:
                fn = lambda rx=rx, i=i: self.chat(1000 + i, extra_body={"regex": rx})  # noqa: E731
            jobs.append((f"regex {i} {rx}", fn, check))
        for i, (g, ref) in enumerate(self.ebnfs):
            def check(text, ref=ref):
                assert ref(text) if callable(ref) else re.fullmatch(ref, text), "not in the language"
            fn = lambda g=g, i=i: self.generate({"ebnf": g}, 2000 + i)  # noqa: E731
            jobs.append((f"ebnf {i}", fn, check))
        for i in range(8):  # json_object: any JSON object
            def check(text):
                assert isinstance(json.loads(text), dict), "not an object"
            jobs.append((f"json_object {i}", lambda i=i: self.chat(3000 + i, response_format={"type": "json_object"}),
                         check))
        self.assertGreaterEqual(len(jobs), 200)
        stops, lengths = self.run_all(jobs)
        print(f"{len(jobs)} constrained requests: {stops} finished with stop and validated, {lengths} hit max_tokens")
        self.assertGreaterEqual(stops, int(0.95 * len(jobs)))

    def test_greedy_and_sampling_modes_stay_inside_the_grammar(self):
        schema = cases.SCHEMAS[-1]
        modes = [{"temperature": 0}, {"temperature": 0.7, "top_k": 3}, {"temperature": 1.0, "top_p": 0.5},
                 {"temperature": 1.0, "min_p": 0.5}, {"temperature": 1.2, "repetition_penalty": 1.3},
                 {"temperature": 0.9, "presence_penalty": 1.0, "frequency_penalty": 0.5}]
        for k, mode in enumerate(modes):
            text, finish, _ = self.generate(dict(mode, json_schema=json.dumps(schema)), 5000 + k)
            self.assertEqual(finish, "stop", mode)
            jsonschema.validate(json.loads(text), schema)

    def test_max_tokens_cuts_with_length_and_partial_text(self):
        schema = {"type": "array", "items": {"type": "integer"}, "minItems": 50}
        text, finish, tokens = self.generate({"json_schema": json.dumps(schema), "max_new_tokens": 7}, 9)
        self.assertEqual((finish, tokens), ("length", 7))
        self.assertTrue(text.startswith("["), text)

    def test_n_choices_and_stream_are_each_constrained(self):
        rx = r"(yes|no)-\d{2}"
        r = self.client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=20, temperature=1.0, n=4,
                                                seed=3, extra_body={"regex": rx})
        for c in r.choices:
            self.assertEqual(c.finish_reason, "stop")
            self.assertRegex(c.message.content, "^" + rx + "$")
        stream = self.client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=20, temperature=1.0,
                                                     seed=4, stream=True, extra_body={"regex": rx})
        text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        self.assertRegex(text, "^" + rx + "$")

    def test_bad_grammars_are_400_and_the_server_stays_healthy(self):
        import openai
        for field, value, why in cases.BAD:
            with self.subTest(why=why):
                with self.assertRaises(openai.BadRequestError) as ctx:
                    self.client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8,
                                                        extra_body={field: value})
                err = ctx.exception.body
                self.assertEqual(ctx.exception.status_code, 400)
                self.assertEqual(err.get("param"), field, err)
                self.assertNotIn("\n", err["message"])
                self.assertNotRegex(err["message"], r"\.cc:\d+")
                status, body = self.server.json("POST", "/generate",
                                                {"text": "x", "sampling_params": {field: value, "max_new_tokens": 4}})
                self.assertEqual(status, 400, body)
                self.assertEqual(body["error"]["param"], "sampling_params." + field)
        bad_formats = [{"type": "xml"}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": {"schema": {}}},
                       {"type": "json_object", "extra": 1}, "json"]
        for rf in bad_formats:
            with self.subTest(response_format=rf):
                status, body = self.server.json("POST", "/v1/chat/completions",
                                                {"messages": MESSAGES, "response_format": rf})
                self.assertEqual(status, 400, body)
                self.assertTrue(body["error"]["param"].startswith("response_format"), body)
        status, body = self.server.json("POST", "/v1/completions",
                                        {"prompt": "x", "regex": "a", "json_schema": "{}"})
        self.assertEqual(status, 400, body)
        self.assertIn("at most one", body["error"]["message"])
        self.assertEqual(self.server.request("GET", "/health")[0], 200)
        text, finish, _ = self.generate({"regex": "ok"}, 1)
        self.assertEqual((text, finish), ("ok", "stop"))

    def test_plain_text_format_and_unconstrained_requests_are_unchanged(self):
        r = self.client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=5, temperature=0,
                                                response_format={"type": "text"})
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))


class MultiStepDecode(unittest.TestCase):
    def test_multi_step_decode_keeps_constrained_requests_exact(self):
        server = e2e.ServerProcess("--fake-uniform-logits", "--num-continuous-decode-steps", "4")
        try:
            rx = r"[a-c]{3}-\d{3}"
            for seed in range(6):
                status, body = server.json("POST", "/generate", {"text": "x", "sampling_params": {
                    "regex": rx, "max_new_tokens": 64, "temperature": 1.0, "sampling_seed": seed}})
                self.assertEqual(status, 200, body)
                self.assertRegex(body["text"], "^" + rx + "$")
        finally:
            server.stop()


# Finite languages (a random-weight model must still end them): (kind, grammar, check(text)).
ENUM_SCHEMA = {"type": "object", "properties": {"a": {"enum": ["x", "yy", "zzz"]}, "b": {"type": "boolean"},
                                                "c": {"type": "string", "maxLength": 4}},
               "required": ["a", "b", "c"], "additionalProperties": False}


def check_enum_object(text):
    v = json.loads(text)
    assert set(v) == {"a", "b", "c"} and v["a"] in ("x", "yy", "zzz") and isinstance(v["b"], bool), v
    assert isinstance(v["c"], str) and len(v["c"]) <= 4, v
    return True


FINITE = [("regex", r"[a-c]{3}-\d{3}", lambda t: re.fullmatch(r"[a-c]{3}-\d{3}", t)),
          ("regex", r"(yes|no)-\d{2}", lambda t: re.fullmatch(r"(yes|no)-\d{2}", t)),
          ("regex", r"\d{1,4}", lambda t: re.fullmatch(r"\d{1,4}", t)),
          ("json_schema", json.dumps(ENUM_SCHEMA), check_enum_object),
          ("ebnf", 'root ::= "<" ("ab" | "c")* ">"', None)]  # unbounded: stop validates, length allowed


class RealModel(e2e.FolderServer):
    """Constrained decoding on a real model's logits: REAL_BACKEND (cpu in CI, cuda on the GPU)."""
    BACKEND = REAL_BACKEND
    SERVER_ARGS = (("--page-size", "4", "--max-running-requests", "8", "--num-continuous-decode-steps", "2",
                    "--max-total-tokens", "16384", "--context-length", "1024") if REAL_BACKEND == "cuda" else
                   ("--kv-cache-dtype", "f32", "--page-size", "4", "--max-running-requests", "8",
                    "--num-continuous-decode-steps", "2"))
    MODES = [{"temperature": 0}, {"temperature": 0.8}, {"temperature": 1.0, "top_k": 3, "top_p": 0.9, "min_p": 0.05},
             {"temperature": 1.2, "repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3}]

    @classmethod
    def make_folder(cls):
        e2e.CpuModel.make_folder.__func__(cls)

    def gen(self, ids, sp):
        status, body = self.server.json("POST", "/generate", {"input_ids": ids, "sampling_params": sp})
        self.assertEqual(status, 200, body)
        return body["text"], body["meta_info"]["finish_reason"]["type"], body["output_ids"]

    def test_finite_grammars_finish_and_validate_in_every_mode(self):
        for k, (kind, g, check) in enumerate(FINITE):
            for m, mode in enumerate(self.MODES):
                with self.subTest(kind=kind, grammar=g, mode=mode):
                    sp = dict(mode, max_new_tokens=64, sampling_seed=17 * k + m, **{kind: g})
                    text, finish, _ = self.gen([5 + k, 17 + m, 300, 42], sp)
                    if check is None:
                        if finish == "stop":
                            self.assertRegex(text, r"^<(ab|c)*>$")
                        continue
                    self.assertEqual(finish, "stop", text)
                    self.assertTrue(check(text), text)

    def test_a_mixed_batch_gives_each_request_its_output_alone(self):
        specs = []
        for i in range(12):
            sp = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": i >= 8}  # greedy: no draw to differ
            if i < 8:  # constrained; 8.. unconstrained
                kind, g, _ = FINITE[i % len(FINITE)]
                sp[kind] = g
            specs.append(([(7 * i + j) % 780 + 1 for j in range(3 + 2 * i)], sp))
        alone = [self.gen(ids, sp) for ids, sp in specs]
        with cf.ThreadPoolExecutor(len(specs)) as pool:
            together = list(pool.map(lambda s: self.gen(*s), specs))
        for i, (a, t) in enumerate(zip(alone, together)):
            self.assertEqual(t[2], a[2], f"request {i}: batched vs alone")
        for i in range(8):
            kind, g, check = FINITE[i % len(FINITE)]
            if check is not None:
                self.assertEqual(alone[i][1], "stop", alone[i])
                self.assertTrue(check(alone[i][0]), alone[i])


@unittest.skipUnless(REAL_BACKEND == "cpu", "NEXTN runs on the CPU backend only")
class RealModelSpeculative(RealModel):
    """RealModel's tests again with `--speculative-algorithm NEXTN` (constrained requests inside the
    draft/verify rounds: every draft and verify row masked by the grammar), and greedy output
    equal to a server without speculation, token for token."""
    SERVER_ARGS = ("--kv-cache-dtype", "f32", "--page-size", "4", "--max-running-requests", "8",
                   "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3")

    def test_greedy_constrained_output_equals_the_server_without_speculation(self):
        plain = e2e.ServerProcess("--model", self.dir, "--kv-cache-dtype", "f32", "--page-size", "4",
                                  "--max-running-requests", "8", backend="cpu")
        try:
            rounds = 0
            for k, (kind, g, check) in enumerate(FINITE):
                for p in range(3):
                    with self.subTest(kind=kind, grammar=g, prompt=p):
                        body = {"input_ids": [3 + 11 * k + p, 40 + p, 7, 500 - k],
                                "sampling_params": {"max_new_tokens": 64, "temperature": 0, kind: g}}
                        s1, want = plain.json("POST", "/generate", body)
                        s2, got = self.server.json("POST", "/generate", body)
                        self.assertEqual((s1, s2), (200, 200), (want, got))
                        self.assertEqual(got["output_ids"], want["output_ids"])
                        self.assertEqual(got["meta_info"]["finish_reason"], want["meta_info"]["finish_reason"])
                        rounds += got["meta_info"]["spec_verify_ct"]
                        if check is not None:
                            self.assertTrue(check(got["text"]), got["text"])
            self.assertGreater(rounds, 0, "the constrained requests ran draft/verify rounds")
        finally:
            self.assertEqual(plain.stop(), 0)


if __name__ == "__main__":
    e2e.BINARY = sys.argv.pop(1) if len(sys.argv) > 1 else e2e.BINARY
    unittest.main(verbosity=2)
