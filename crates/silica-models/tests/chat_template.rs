//! Chat templates rendered from the model's own Jinja source
//! (`tokenizer.chat_template`) with minijinja, as transformers'
//! `apply_chat_template` renders them.
//!
//! The templates below are the ones popular models' files carry (the GGUF
//! conversions store the text of the Hugging Face repos'
//! `tokenizer_config.json`); the expected prompts are what transformers'
//! renderer (Jinja2 with its `raise_exception`, `strftime_now` and
//! `tojson`) writes for them. The fallback templates, the choice between
//! them, BOS handling and errors are checked on small GGUF files written
//! here; the default model (SmolLM2, fetched like the other model tests)
//! renders its own template to the prompt it always got.

use std::path::PathBuf;

use serde_json::Value;
use silica_models::Error;
use silica_models::chat::{ChatTemplate, JinjaTemplate, Message, ModelTemplate, encode_prompt};
use silica_models::gguf::{GgufFile, GgufWriter, MetaValue};
use silica_models::tokenizer::Tokenizer;

// ---------------------------------------------------------------------------
// templates

/// HuggingFaceTB/SmolLM2-135M-Instruct (the default model), as its GGUF
/// file stores it.
const SMOLLM2: &str = r##"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %}"##;

/// Qwen/Qwen2.5-7B-Instruct (ChatML with tools and a default system prompt).
const QWEN25: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"##;

/// Qwen/Qwen3-8B (thinking: Python string methods, `[::-1]`, namespaces).
const QWEN3: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"##;

/// meta-llama/Meta-Llama-3-8B-Instruct.
const LLAMA3: &str = r##"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %}"##;

/// meta-llama/Llama-3.1-8B-Instruct (a fixed date, tools, builtin tools).
const LLAMA31: &str = r##"{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"##;

/// meta-llama/Llama-3.2-1B-Instruct (today's date from `strftime_now`).
const LLAMA32: &str = r##"{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"##;

/// meta-llama/Llama-2-7b-chat-hf.
const LLAMA2: &str = r##"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"##;

/// google/gemma-2-2b-it: a system message is an error.
const GEMMA2: &str = r##"{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"##;

/// google/gemma-3-1b-it: the system message goes into the first user turn.
const GEMMA3: &str = r##"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"##;

/// microsoft/Phi-3.5-mini-instruct (and Phi-3-mini's later revisions).
const PHI35: &str = r##"{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"##;

/// microsoft/Phi-3-mini-4k-instruct as first released (BOS written by the
/// template, system messages left out).
const PHI3_FIRST: &str = r##"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}"##;

/// mistralai/Mistral-7B-Instruct-v0.1 and v0.2: roles must alternate from
/// the first message, so a system message is an error.
const MISTRAL_V01: &str = r##"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"##;

/// mistralai/Mistral-7B-Instruct-v0.3: the system message goes into the
/// last user turn.
const MISTRAL_V03: &str = r##"{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"##;

/// A training-style template with transformers' `{% generation %}` marks
/// around the assistant's text (as in SmolLM3's and fine-tuning recipes').
const GENERATION_MARKS: &str = r##"{%- for message in messages %}
    {%- if message.role == "assistant" %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}
        {{- message.content + '<|im_end|>\n' }}
        {%- endgeneration %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"##;

/// `tojson` as transformers defines it (Python's `json.dumps`).
const TOJSON: &str = r##"{{ messages | tojson }}|{{ {"b": [1, 2.5, 1e-05, 1e20, none, true, false], "a": "é\n\"x\"</\t"} | tojson(indent=2) }}|{{ {"b": 1, "a": {"d": [], "c": {}}} | tojson(sort_keys=true) }}|{{ "é😀" | tojson(ensure_ascii=true) }}|{{ [1, [2, {"k": "v"}]] | tojson(separators=(",", ":")) }}|{{ [] | tojson(indent=4) }}"##;

/// Python's string methods, as templates call them.
const STRING_METHODS: &str = r##"{{ "  a b \n".strip() }}|{{ "xxhixx".strip("x") }}|{{ "\n\nhi".lstrip("\n") }}|{{ "a</think>b</think>c".split("</think>")[-1] }}|{% if "Hello".startswith("He") and "Hello".endswith("lo") %}yes{% endif %}|{{ "abc".upper() }}|{{ "ABC".lower() }}|{{ "a b".title() }}|{{ "a-b-c".replace("-", "+") }}|{% for k, v in {"k": 1, "j": 2}.items() %}{{ k }}={{ v }};{% endfor %}|{{ {"k": 1}.get("k") }}{{ {"k": 1}.get("z", 5) }}|{{ messages[0]['content'] | trim }}|{{ messages | length }}"##;

// ---------------------------------------------------------------------------
// helpers

/// system, user, assistant (with spaces around its text), user.
fn conversation() -> Vec<Message> {
    vec![
        Message::system("You are terse."),
        Message::user("Hi there"),
        Message::assistant(" Hello! How can I help? "),
        Message::user("What is 2+2?"),
    ]
}

/// The conversation without its system message.
fn without_system() -> Vec<Message> {
    conversation()[1..].to_vec()
}

fn jinja(source: &str, bos: &str, eos: &str) -> JinjaTemplate {
    JinjaTemplate::new(source, bos, eos).unwrap_or_else(|e| panic!("{e}"))
}

fn render(source: &str, bos: &str, eos: &str, messages: &[Message]) -> String {
    jinja(source, bos, eos)
        .render(messages, true)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn invalid_input(result: silica_models::Result<String>) -> String {
    match result {
        Err(Error::InvalidInput(msg)) => msg,
        other => panic!("expected an InvalidInput error, got {other:?}"),
    }
}

/// A GGUF file in memory with this metadata (no tensors).
fn gguf(name: &str, metadata: Vec<(&str, MetaValue)>) -> GgufFile {
    let mut w = GgufWriter::new();
    for (key, value) in metadata {
        w.metadata(key, value).unwrap();
    }
    let bytes = w.write(Vec::new()).unwrap();
    GgufFile::from_bytes(bytes, name).unwrap()
}

fn strings(items: &[&str]) -> MetaValue {
    MetaValue::Array(
        items
            .iter()
            .map(|s| MetaValue::String(s.to_string()))
            .collect(),
    )
}

fn string(s: &str) -> MetaValue {
    MetaValue::String(s.to_string())
}

/// A byte-level BPE vocabulary: BOS `<s>`, EOS `</s>`, `h`, `i`, `hi`.
fn tiny_vocabulary(add_bos: bool) -> Vec<(&'static str, MetaValue)> {
    vec![
        ("tokenizer.ggml.model", string("gpt2")),
        ("tokenizer.ggml.pre", string("smollm")),
        (
            "tokenizer.ggml.tokens",
            strings(&["<s>", "</s>", "h", "i", "hi"]),
        ),
        (
            "tokenizer.ggml.token_type",
            MetaValue::Array([3, 3, 1, 1, 1].map(MetaValue::I32).to_vec()),
        ),
        ("tokenizer.ggml.merges", strings(&["h i"])),
        ("tokenizer.ggml.bos_token_id", MetaValue::U32(0)),
        ("tokenizer.ggml.eos_token_id", MetaValue::U32(1)),
        ("tokenizer.ggml.add_bos_token", MetaValue::Bool(add_bos)),
    ]
}

// ---------------------------------------------------------------------------
// real templates

/// A name, a template, its BOS and EOS texts, the messages and the prompt
/// transformers renders.
type Case<'a> = (&'a str, &'a str, &'a str, &'a str, &'a [Message], &'a str);

#[test]
fn real_templates_render_as_transformers_does() {
    let conv = conversation();
    let nosys = without_system();
    let cases: &[Case] = &[
        (
            "SmolLM2",
            SMOLLM2,
            "<|im_start|>",
            "<|im_end|>",
            &conv,
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n Hello! How can I help? <|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            "SmolLM2, default system prompt",
            SMOLLM2,
            "<|im_start|>",
            "<|im_end|>",
            &nosys,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n Hello! How can I help? <|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            "Qwen2.5",
            QWEN25,
            "",
            "<|im_end|>",
            &conv,
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n Hello! How can I help? <|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            "Qwen2.5, default system prompt",
            QWEN25,
            "",
            "<|im_end|>",
            &nosys,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n Hello! How can I help? <|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            "Llama 3",
            LLAMA3,
            "<|begin_of_text|>",
            "<|eot_id|>",
            &conv,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        (
            "Llama 3.1",
            LLAMA31,
            "<|begin_of_text|>",
            "<|eot_id|>",
            &conv,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        (
            "Llama 3.1, no system message",
            LLAMA31,
            "<|begin_of_text|>",
            "<|eot_id|>",
            &nosys,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        (
            "Llama 2",
            LLAMA2,
            "<s>",
            "</s>",
            &conv,
            "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello! How can I help? </s><s>[INST] What is 2+2? [/INST]",
        ),
        (
            "Gemma 2, no system message",
            GEMMA2,
            "<bos>",
            "<eos>",
            &nosys,
            "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\nHello! How can I help?<end_of_turn>\n<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
        ),
        (
            "Gemma 3 (system folded into the first user turn)",
            GEMMA3,
            "<bos>",
            "<eos>",
            &conv,
            "<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello! How can I help?<end_of_turn>\n<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
        ),
        (
            "Phi-3.5",
            PHI35,
            "<s>",
            "<|endoftext|>",
            &conv,
            "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\n Hello! How can I help? <|end|>\n<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n",
        ),
        (
            "Phi-3 as first released (system left out)",
            PHI3_FIRST,
            "<s>",
            "<|endoftext|>",
            &conv,
            "<s><|user|>\nHi there<|end|>\n<|assistant|>\n Hello! How can I help? <|end|>\n<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n",
        ),
        (
            "Mistral v0.1, no system message",
            MISTRAL_V01,
            "<s>",
            "</s>",
            &nosys,
            "<s>[INST] Hi there [/INST] Hello! How can I help? </s>[INST] What is 2+2? [/INST]",
        ),
        (
            "Mistral v0.3 (system in the last user turn)",
            MISTRAL_V03,
            "<s>",
            "</s>",
            &conv,
            "<s>[INST] Hi there[/INST] Hello! How can I help?</s>[INST] You are terse.\n\nWhat is 2+2?[/INST]",
        ),
        (
            "{% generation %} marks",
            GENERATION_MARKS,
            "",
            "",
            &conv,
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n Hello! How can I help? <|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        ),
    ];
    let mut failures = Vec::new();
    for &(name, source, bos, eos, messages, want) in cases {
        match JinjaTemplate::new(source, bos, eos).and_then(|t| t.render(messages, true)) {
            Ok(got) if got == want => {}
            Ok(got) => failures.push(format!("{name}:\n  got  {got:?}\n  want {want:?}")),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn qwen3_drops_earlier_reasoning() {
    // Python's split/lstrip/rstrip/startswith/endswith, `[::-1]`, namespaces
    let messages = [
        Message::system("You are terse."),
        Message::user("Hi there"),
        Message::assistant("<think>\nThey greet me.\n</think>\n\nHello! How can I help?"),
        Message::user("What is 2+2?"),
    ];
    assert_eq!(
        render(QWEN3, "", "<|im_end|>", &messages),
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello! How can I help?<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn llama32_writes_the_date_from_strftime_now() {
    let pinned = jinja(LLAMA32, "<|begin_of_text|>", "<|eot_id|>")
        .with_date(2025, 3, 9)
        .unwrap();
    assert_eq!(
        pinned.render(&conversation(), true).unwrap(),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 09 Mar 2025\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    // unpinned: today, as `%d %b %Y`
    let today = render(LLAMA32, "<|begin_of_text|>", "<|eot_id|>", &conversation());
    let date = today
        .split("Today Date: ")
        .nth(1)
        .and_then(|rest| rest.split('\n').next())
        .unwrap();
    let parts: Vec<&str> = date.split(' ').collect();
    assert_eq!(parts.len(), 3, "{date:?}");
    assert!(parts[0].len() == 2 && parts[0].parse::<u32>().is_ok_and(|d| (1..=31).contains(&d)));
    assert!(
        [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"
        ]
        .contains(&parts[1]),
        "{date:?}"
    );
    assert!(parts[2].parse::<u32>().is_ok_and(|y| y >= 2025), "{date:?}");
    // an impossible date is refused
    assert!(matches!(
        jinja(LLAMA32, "", "").with_date(2025, 2, 29),
        Err(Error::InvalidInput(_))
    ));
}

#[test]
fn templates_that_reject_a_system_message_say_why() {
    let gemma2 = jinja(GEMMA2, "<bos>", "<eos>");
    let msg = invalid_input(gemma2.render(&conversation(), true));
    assert_eq!(
        msg,
        "the chat template rejects these messages: System role not supported"
    );
    let mistral = jinja(MISTRAL_V01, "<s>", "</s>");
    let msg = invalid_input(mistral.render(&conversation(), true));
    assert_eq!(
        msg,
        "the chat template rejects these messages: Conversation roles must alternate user/assistant/user/assistant/..."
    );
}

#[test]
fn raise_exception_carries_the_template_message() {
    let t = jinja(
        "{% if messages | length > 1 %}{{ raise_exception('Only ' + 'one message, not ' + (messages | length | string)) }}{% endif %}ok",
        "",
        "",
    );
    assert_eq!(t.render(&[Message::user("a")], true).unwrap(), "ok");
    let msg = invalid_input(t.render(&[Message::user("a"), Message::user("b")], true));
    assert_eq!(
        msg,
        "the chat template rejects these messages: Only one message, not 2"
    );
}

#[test]
fn syntax_errors_are_clear() {
    // an unclosed block, found at the end (the last line)
    let e = JinjaTemplate::new("{% for m in messages %}\n{{ m.content }}\n", "", "").unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::InvalidInput(_)), "{e:?}");
    assert!(
        msg.starts_with("chat template: syntax error: unexpected end of input"),
        "{msg}"
    );
    assert!(msg.ends_with("expected end of block (line 2)"), "{msg}");
    // a bad expression on line 2
    let msg = JinjaTemplate::new("ok\n{{ messages[ }}", "", "")
        .unwrap_err()
        .to_string();
    assert!(msg.starts_with("chat template: syntax error"), "{msg}");
    assert!(msg.contains("(line 2)"), "{msg}");
    // an unknown tag
    let msg = JinjaTemplate::new("{% frobnicate %}", "", "")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("syntax error"), "{msg}");
    assert!(msg.contains("frobnicate"), "{msg}");
}

#[test]
fn render_errors_name_the_problem() {
    // an attribute of an undefined value, on line 2
    let t = jinja("ok\n{{ nothing.here }}", "", "");
    let msg = invalid_input(t.render(&[Message::user("a")], true));
    assert!(msg.starts_with("chat template: undefined value"), "{msg}");
    assert!(msg.contains("(line 2)"), "{msg}");
    // an unknown filter is found when the template is compiled
    let msg = JinjaTemplate::new("{{ messages | frobnicate }}", "", "")
        .and_then(|t| t.render(&[], true))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("unknown filter"), "{msg}");
}

#[test]
fn tojson_and_python_methods_follow_python() {
    assert_eq!(
        render(TOJSON, "", "", &[Message::user("Hi there")]),
        "[{\"role\": \"user\", \"content\": \"Hi there\"}]|{\n  \"b\": [\n    1,\n    2.5,\n    1e-05,\n    1e+20,\n    null,\n    true,\n    false\n  ],\n  \"a\": \"é\\n\\\"x\\\"</\\t\"\n}|{\"a\": {\"c\": {}, \"d\": []}, \"b\": 1}|\"\\u00e9\\ud83d\\ude00\"|[1,[2,{\"k\":\"v\"}]]|[]"
    );
    assert_eq!(
        render(
            STRING_METHODS,
            "",
            "",
            &[Message::assistant(" Hello! How can I help? ")]
        ),
        "a b|hi|hi|c|yes|ABC|abc|A B|a+b+c|k=1;j=2;|15|Hello! How can I help?|1"
    );
}

#[test]
fn special_tokens_and_generation_prompt_reach_the_template() {
    let t = jinja(
        "{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{% if add_generation_prompt %}gen{% endif %}|{% if tools is none and documents is none %}none{% endif %}",
        "<s>",
        "</s>",
    )
    .with_token("unk_token", "<unk>");
    assert_eq!(t.render(&[], true).unwrap(), "<s>|</s>|<unk>|gen|none");
    assert_eq!(t.render(&[], false).unwrap(), "<s>|</s>|<unk>||none");
}

#[test]
fn known_templates_match_their_jinja_sources() {
    // the fallbacks write what the templates they stand for write
    let conversations = [
        conversation(),
        without_system(),
        vec![Message::user("  Only one  ")],
        vec![Message::system("Be brief."), Message::user("Hi")],
    ];
    for (source, bos, eos, known) in [
        (SMOLLM2, "<|im_start|>", "<|im_end|>", "chatml"),
        (LLAMA3, "<|begin_of_text|>", "<|eot_id|>", "llama3"),
        (LLAMA2, "<s>", "</s>", "llama2"),
    ] {
        let fallback = ChatTemplate::detect(Some(source)).unwrap();
        assert_eq!(fallback.name(), known);
        let t = jinja(source, bos, eos);
        for messages in &conversations {
            // Llama 2 writes no generation prompt
            for add in [true, false] {
                assert_eq!(
                    t.render(messages, add).unwrap(),
                    fallback.render(messages, add),
                    "{known}, add_generation_prompt={add}, {messages:?}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// GGUF files: the file's template, the fallbacks, BOS

#[test]
fn a_file_template_is_rendered_with_its_special_tokens() {
    let mut meta = tiny_vocabulary(false);
    meta.push(("tokenizer.ggml.unknown_token_id", MetaValue::U32(2)));
    meta.push((
        "tokenizer.chat_template",
        string("{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{% if pad_token is defined %}pad{% endif %}|{{ messages[0].content }}"),
    ));
    let file = gguf("chat.gguf", meta);
    let t = ModelTemplate::from_gguf(&file).unwrap().unwrap();
    assert!(matches!(t, ModelTemplate::Gguf(_)));
    assert!(!t.is_fallback());
    assert_eq!(t.name(), "gguf");
    assert_eq!(
        t.render(&[Message::user("x")], true).unwrap(),
        "<s>|</s>|h||x"
    );
}

#[test]
fn files_without_a_template_get_a_known_one() {
    let with_tokens = |tokens: &[&str], name: &str| {
        gguf(
            "model.gguf",
            vec![
                ("general.name", string(name)),
                ("tokenizer.ggml.tokens", strings(tokens)),
            ],
        )
    };
    let pick = |file: &GgufFile| ModelTemplate::from_gguf(file).unwrap().map(|t| t.name());
    assert_eq!(
        pick(&with_tokens(
            &["<|im_start|>", "<|im_end|>", "a"],
            "Some model"
        ))
        .as_deref(),
        Some("chatml (fallback)")
    );
    assert_eq!(
        pick(&with_tokens(
            &[
                "<|begin_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>"
            ],
            "Some model"
        ))
        .as_deref(),
        Some("llama3 (fallback)")
    );
    assert_eq!(
        pick(&with_tokens(&["<s>", "</s>"], "Llama-2-7b-chat-hf")).as_deref(),
        Some("llama2 (fallback)")
    );
    // TheBloke's conversions: `LLaMA v2` and the file name
    let thebloke = gguf(
        "llama-2-7b-chat.Q4_0.gguf",
        vec![
            ("general.name", string("LLaMA v2")),
            ("tokenizer.ggml.tokens", strings(&["<s>", "</s>"])),
        ],
    );
    assert_eq!(pick(&thebloke).as_deref(), Some("llama2 (fallback)"));
    // a base Llama 2, or anything else: none
    assert_eq!(pick(&with_tokens(&["<s>", "</s>"], "Llama-2-7b-hf")), None);
    assert_eq!(
        pick(&with_tokens(&["<s>", "</s>"], "tiny test model")),
        None
    );
    // the ChatML fallback has no default system prompt
    let t = ModelTemplate::from_gguf(&with_tokens(&["<|im_start|>", "<|im_end|>"], "m"))
        .unwrap()
        .unwrap();
    assert!(t.is_fallback());
    assert_eq!(
        t.render(&[Message::user("Hi")], true).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    // an empty template counts as none
    let empty = gguf(
        "model.gguf",
        vec![
            ("tokenizer.chat_template", string("  ")),
            (
                "tokenizer.ggml.tokens",
                strings(&["<|im_start|>", "<|im_end|>"]),
            ),
        ],
    );
    assert_eq!(pick(&empty).as_deref(), Some("chatml (fallback)"));
}

#[test]
fn bad_file_templates_are_errors_naming_the_key() {
    let broken = gguf(
        "broken.gguf",
        vec![("tokenizer.chat_template", string("{% if messages %}oops"))],
    );
    let e = ModelTemplate::from_gguf(&broken).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    assert!(
        msg.starts_with("broken.gguf: unsupported: tokenizer.chat_template: syntax error"),
        "{msg}"
    );
    let not_text = gguf(
        "number.gguf",
        vec![("tokenizer.chat_template", MetaValue::U32(7))],
    );
    let msg = ModelTemplate::from_gguf(&not_text).unwrap_err().to_string();
    assert!(msg.contains("'tokenizer.chat_template'"), "{msg}");
    assert!(msg.contains("expected a string"), "{msg}");
}

#[test]
fn a_prompt_starts_with_one_bos() {
    for (add_bos, template, want) in [
        // the tokenizer adds BOS: the template's is not doubled
        (true, "{{ bos_token }}hi", vec![0, 4]),
        (true, "hi", vec![0, 4]),
        // it does not: the text decides
        (false, "{{ bos_token }}hi", vec![0, 4]),
        (false, "hi", vec![4]),
        // a BOS later in the text stays
        (true, "{{ bos_token }}hi{{ bos_token }}", vec![0, 4, 0]),
    ] {
        let mut meta = tiny_vocabulary(add_bos);
        meta.push(("tokenizer.chat_template", string(template)));
        let file = gguf("tiny.gguf", meta);
        let tokenizer = Tokenizer::from_gguf(&file).unwrap();
        let t = ModelTemplate::from_gguf(&file).unwrap().unwrap();
        let ids = t.encode(&tokenizer, &[Message::user("x")], true).unwrap();
        assert_eq!(ids, want, "add_bos={add_bos}, {template:?}");
        let text = t.render(&[Message::user("x")], true).unwrap();
        assert_eq!(encode_prompt(&tokenizer, &text).unwrap(), want);
    }
}

// ---------------------------------------------------------------------------
// the default model

fn golden(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// `SILICA_TEST_GGUF` if set, else the built-in default decoder (SmolLM2,
/// fetched into the cache on first use).
fn default_model() -> GgufFile {
    let path = match std::env::var_os("SILICA_TEST_GGUF") {
        Some(path) => PathBuf::from(path),
        None => {
            silica_models::resolve::resolve_decoder(None).expect("the default decoder resolves")
        }
    };
    GgufFile::open(path).expect("the model file opens")
}

#[test]
fn default_model_renders_its_own_template_as_before() {
    let file = default_model();
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    let template = ModelTemplate::from_gguf(&file).unwrap().unwrap();
    assert_eq!(template.name(), "gguf");
    // what silica rendered before it had a Jinja engine: the ChatML
    // template recognised from the same source
    let source = file.get("tokenizer.chat_template").and_then(|v| v.as_str());
    let before = ChatTemplate::detect(source).expect("SmolLM2's template is ChatML");
    let mut conversations = vec![
        conversation(),
        without_system(),
        vec![Message::system("Be brief."), Message::user("Hi")],
    ];
    // the golden chat prompts of scripts/reference_smollm2.py, with their ids
    let g = golden("smollm2.json");
    let prompts: Vec<&Value> = g["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["chat"].as_bool() == Some(true))
        .collect();
    assert!(!prompts.is_empty());
    for p in &prompts {
        let user = p["messages"][0]["content"].as_str().unwrap();
        let messages = vec![Message::user(user)];
        assert_eq!(
            template.render(&messages, true).unwrap(),
            p["text"].as_str().unwrap()
        );
        let ids: Vec<u32> = p["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(template.encode(&tokenizer, &messages, true).unwrap(), ids);
        conversations.push(messages);
    }
    for messages in &conversations {
        let old = before.render(messages, true);
        assert_eq!(
            template.render(messages, true).unwrap(),
            old,
            "{messages:?}"
        );
        // and the same ids as before (the text encoded without adding BOS)
        assert_eq!(
            template.encode(&tokenizer, messages, true).unwrap(),
            tokenizer.encode(&old, false).unwrap()
        );
    }
}
