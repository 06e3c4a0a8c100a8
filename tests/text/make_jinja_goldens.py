#!/usr/bin/env python3
"""Regenerates jinja-goldens.json: each case rendered by Python Jinja2 configured as Hugging Face
transformers configures it for chat templates (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, its own tojson and raise_exception). The C++ interpreter must reproduce every output or error.
Run from the repository root: python3 tests/text/make_jinja_goldens.py"""
import json

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

V = {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "yo", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1, "b": "x"}}}]},
                  {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}],
     "d": {"z": 1, "a": [1, 2.5, None, True, "s"], "nested": {"k": "v"}},
     "s": "  Hello, Wörld!  ", "n": 7, "f": 0.1, "big": 1e16, "small": 1e-5, "neg": -3, "empty": [], "t": True}

CASES = [
    ("text_and_expr", "a{{ n }}b{{ s }}c"),
    ("whitespace_control", "x  {%- if t -%}  y  {%- endif -%}  z"),
    ("trim_and_lstrip_blocks", "line1\n    {% if t %}\n    inside\n    {% endif %}\nline2\n"),
    ("lstrip_disabled_by_plus", "a\n    {%+ if t %}b{% endif %}\n"),
    ("comments", "a {# comment #}\n  {#- stripped -#}  b"),
    ("raw", "{% raw %}{{ not evaluated }}{% endraw %}"),
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %},{% endfor %}"),
    ("for_loop_vars", "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}|{% endfor %}"),
    ("for_previtem_nextitem", "{% for m in messages %}[{{ loop.previtem.role if loop.previtem else '-' }}>{{ m.role }}>{{ loop.nextitem.role if loop.nextitem is defined else '-' }}]{% endfor %}"),
    ("for_else", "{% for x in empty %}x{% else %}none{% endfor %}"),
    ("for_filter_and_unpack", "{% for k, v in d|items if k != 'a' %}{{ k }}={{ v }};{% endfor %}"),
    ("for_dict_iterates_keys", "{% for k in d %}{{ k }},{% endfor %}"),
    ("break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
    ("loop_cycle", "{% for i in range(4) %}{{ loop.cycle('a', 'b') }}{% endfor %}"),
    ("set_scoping", "{% set x = 1 %}{% for i in range(2) %}{% set x = x + 10 %}{{ x }},{% endfor %}{{ x }}"),
    ("set_if_does_not_scope", "{% if t %}{% set y = 5 %}{% endif %}{{ y }}"),
    ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for m in messages %}{% if m.role == 'tool' %}{% set ns.count = ns.count + 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}"),
    ("set_block", "{% set block %}inner {{ n }}{% endset %}[{{ block }}]"),
    ("set_tuple", "{% set a, b = [1, 2] %}{{ a }}{{ b }}"),
    ("macro_defaults_and_kwargs", "{% macro greet(name, punct='!', upper=false) %}{{ (name|upper if upper else name) ~ punct }}{% endmacro %}{{ greet('bob') }} {{ greet('amy', '?') }} {{ greet('x', upper=true) }}"),
    ("macro_sees_globals", "{% set g = 'G' %}{% macro m() %}{{ g }}{{ n }}{% endmacro %}{{ m() }}"),
    ("macro_result_filtered", "{% macro m() %}  padded  {% endmacro %}[{{ m()|trim }}]"),
    ("tojson", "{{ d|tojson }} {{ 'ü\"\\n'|tojson }} {{ [1.0, 2.50, 1e100]|tojson }}"),
    ("tojson_indent", "{{ d|tojson(indent=2) }}"),
    ("string_filter_and_repr", "{{ d }} {{ d.a|string }} {{ none }} {{ t }} {{ f }} {{ big }} {{ small }} {{ 3.0 }} {{ 10/4 }} {{ 7//2 }} {{ -7//2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2**10 }}"),
    ("string_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip().lower() }}|{{ s.upper() }}|{{ s.strip().startswith('Hell') }}|{{ s.strip().endswith(('x', '!')) }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'xxhixx'.strip('x') }}|{{ s.replace('l', 'L') }}|{{ 'ab'.title() }}"),
    ("split_rsplit_think", "{% set c = '<think>\\nr\\n</think>\\n\\nanswer' %}{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[-1].lstrip('\\n') }}"),
    ("filters_misc", "{{ s|trim }}|{{ s|length }}|{{ d|length }}|{{ [3,1,2]|sort }}|{{ [3,1,2]|sort(reverse=true) }}|{{ ['b','A','c']|sort }}|{{ [1,2,3]|join('-') }}|{{ 'abc'|upper }}|{{ 'ABC'|lower }}|{{ [1,1,2]|unique|list }}|{{ [1,2]|first }}|{{ [1,2]|last }}|{{ 'x'|default('y') }}|{{ missing|default('dflt') }}|{{ ''|default('e', true) }}|{{ '42'|int + 1 }}|{{ '2.5'|float }}|{{ -3|abs }}|{{ [1,2,3]|sum }}|{{ 2.567|round(2) }}|{{ 'a b  c'|wordcount }}|{{ [1,2,3]|reverse|list }}|{{ 'abc'|reverse }}"),
    ("selectattr_map", "{{ messages|selectattr('role', 'equalto', 'tool')|map(attribute='content')|join(',') }}|{{ messages|rejectattr('role', 'in', ['tool', 'system'])|map(attribute='role')|list }}|{{ messages|map(attribute='role')|unique|list }}|{{ [1, 0, 2, none]|select|list }}|{{ ['a', 'B']|map('upper')|list }}|{{ messages|selectattr('tool_calls', 'defined')|list|length }}"),
    ("tests", "{{ n is number }}{{ n is integer }}{{ f is float }}{{ s is string }}{{ d is mapping }}{{ d is iterable }}{{ d.a is sequence }}{{ s is sequence }}{{ n is sequence }}{{ none is none }}{{ missing is undefined }}{{ missing is defined }}{{ t is true }}{{ 1 is true }}{{ false is false }}{{ t is boolean }}{{ n is odd }}{{ n is even }}{{ n is divisibleby 7 }}{{ 'x' is in 'xyz' }}{{ missing is iterable }}{{ 'abc' is lower }}"),
    ("in_operator", "{{ 'ell' in s }}{{ 'a' in d }}{{ 'q' in d }}{{ 2 in [1, 2] }}{{ 3 not in [1, 2] }}{{ 'image' in {'image': 1} }}"),
    ("slicing", "{{ [1,2,3,4,5][::-1] }}{{ [1,2,3,4,5][1:3] }}{{ [1,2,3,4,5][-2:] }}{{ [1,2,3,4,5][::2] }}{{ 'héllo'[1:3] }}{{ 'héllo'[::-1] }}{{ messages[-1].content }}{{ messages[::-1][0].role }}"),
    ("concat_and_arith", "{{ 'a' ~ 1 ~ none ~ t ~ missing }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ 'ab' * 3 }}|{{ 1 + 2 * 3 - 4 }}|{{ (1 + 2) * 3 }}|{{ 1 + 2.5 }}|{{ 2 < 3 < 4 }}|{{ 'a' < 'b' }}|{{ not t }}|{{ t and 'yes' }}|{{ none or 'fallback' }}"),
    ("conditional_expr", "{{ 'yes' if t else 'no' }}|{{ 'yes' if none else 'no' }}|{{ 'x' if false }}|{{ ('a' if n > 5 else 'b') ~ '!' }}"),
    ("dict_methods", "{{ d.get('z') }}{{ d.get('q', 'dflt') }}{{ d.get('q') }}{{ d.keys()|list }}{{ d['nested']['k'] }}{{ d.nested.k }}{{ d.items()|list|length }}"),
    ("dict_literal_and_list_literal", "{% set x = {'b': 1, 'a': [1, 'two']} %}{{ x|tojson }}{{ x.a[1] }}{{ (1, 2)|list }}"),
    ("items_on_arguments", "{% for m in messages if m.tool_calls %}{% for tc in m.tool_calls %}{% for k, v in tc.function.arguments|items %}<{{ k }}={{ v|tojson if v is not string else v }}>{% endfor %}{% endfor %}{% endfor %}"),
    ("args_value_conditional_filter", "{% for v in [{'a': 1}, [1, 2], 'str', 3, 2.5, true, none] %}{% set v = v | tojson | safe if v is mapping or (v is sequence and v is not string) else v | string %}{{ v }};{% endfor %}"),
    ("indent_filter", "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}"),
    ("format_filter", "{{ '%s-%d'|format('x', 3) }}|{{ '%s and %s' % ('a', 'b') }}"),
    ("dictsort", "{% for k, v in d|dictsort %}{{ k }},{% endfor %}"),
    ("loop_in_macro_recursion", "{% macro count(x) %}{% if x > 0 %}{{ x }}{{ count(x - 1) }}{% endif %}{% endmacro %}{{ count(3) }}"),
    ("multiline_tags_and_newlines", "{%- for m in messages %}\n{{- m.role }}\n{% endfor -%}\nEND\n\n"),
    ("string_escapes", "{{ 'tab\\there' }}|{{ \"dq 'single'\" }}|{{ 'uni\\u00e9' }}|{{ 'a' 'b' }}"),
    ("filter_block", "{% filter upper %}shout {{ n }}{% endfilter %}"),
    ("none_attribute_chain_defined", "{{ messages[0].missing is defined }}{{ messages[10] is defined }}"),
    ("call_block_caller", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ n }}{% endcall %}"),
    ("call_block_caller_arguments", "{% macro each(items) %}{% for i in items %}{{ caller(i, loop.index) }}{% endfor %}{% endmacro %}{% call(item, idx) each(messages) %}{{ idx }}={{ item.role }};{% endcall %}"),
    ("call_block_defaults_keywords_scope", "{% set outer = 'O' %}{% macro m() %}[{{ caller() }}|{{ caller('x') }}|{{ caller(b=3) }}]{% endmacro %}{% call(v='d', b=2) m() %}{{ v }}{{ b }}{{ outer }}{% endcall %}"),
    ("call_block_nested", "{% macro box(l, r) %}{{ l }}{{ caller() }}{{ r }}{% endmacro %}{% call box('(', ')') %}{% call box('[', ']') %}in{% endcall %}{% endcall %}"),
    ("call_block_missing_parameter", "{% macro m() %}{{ caller() }}{% endmacro %}{% call(a) m() %}[{{ a }}]{% endcall %}"),
    ("call_block_whitespace_and_kwargs", "{% macro m() %}{{ kwargs }}{{ caller() }}{% endmacro %}{% call m() %}\n  line\n{% endcall %}|"),
    ("call_block_caller_undefined_outside", "{% macro m() %}{{ caller is defined }}{% endmacro %}{{ m() }}"),
    ("call_block_in_loop_sees_loop", "{% macro m() %}{{ caller() }}{% endmacro %}{% for x in [1, 2] %}{% call m() %}{{ x }}{{ loop.index }}{% endcall %}{% endfor %}"),
    ("error_caller_without_call_block", "{% macro m() %}{{ caller() }}{% endmacro %}{{ m() }}"),
    ("error_call_block_macro_without_caller", "{% macro m() %}x{% endmacro %}{% call m() %}y{% endcall %}"),
    ("error_call_block_undefined_macro", "{% call nothing() %}y{% endcall %}"),
    ("error_syntax_call_block_unclosed", "{% macro m() %}{{ caller() }}{% endmacro %}{% call m() %}y"),
    ("error_raise_exception", "{{ raise_exception('Custom failure: ' ~ n) }}"),
    ("error_undefined_attribute_call", "{{ messages[0].content.nope() }}"),
    ("error_list_method", "{{ d.a.startswith('x') }}"),
    ("error_undefined_variable_attr", "{{ missing.attr }}"),
    ("error_undefined_call", "{{ nothing() }}"),
    ("error_concat_types", "{{ 'a' + 1 }}"),
    ("error_namespace_assign", "{% set x = 1 %}{% set x.y = 2 %}"),
    ("error_items_on_string", "{{ 'abc'|items|list }}"),
    ("error_syntax_unclosed", "{% if x %}never closed"),
    ("error_syntax_unknown_tag", "{% frobnicate %}"),
    ("error_division_by_zero", "{{ 1 // 0 }}"),
]

out = {"library": f"jinja2 {jinja2.__version__} (transformers chat-template environment)", "variables": V, "cases": []}
for name, source in CASES:
    case = {"name": name, "template": source}
    try:
        case["rendered"] = env.from_string(source).render(**V)
    except Exception as e:  # noqa: BLE001 - the goldens record the exception class and message
        case["error_kind"] = type(e).__name__
        case["error"] = str(e)
    out["cases"].append(case)
with open("tests/text/jinja-goldens.json", "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(f"{len(out['cases'])} cases")
