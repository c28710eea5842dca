"""The openai Python SDK as a user runs it, against a base URL given as argv[1].

Streams one chat completion of argv[2] tokens and prints one JSON line: the text, the number of
chunks, the finish reason; then asks for max_tokens 0 and prints the error the SDK raised.
"""
import json
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=30)
stream = client.chat.completions.create(
    model="sim",
    messages=[{"role": "user", "content": "hi"}],
    stream=True,
    max_tokens=int(sys.argv[2]),
)
text, chunks, finish = "", 0, None
for chunk in stream:
    chunks += 1
    choice = chunk.choices[0]
    text += choice.delta.content or ""
    finish = choice.finish_reason or finish
print(json.dumps({"text": text, "chunks": chunks, "finish_reason": finish}))

try:
    client.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=0
    )
    print(json.dumps({"error": None}))
except openai.APIStatusError as error:
    print(json.dumps({"error": type(error).__name__, "status": error.status_code}))
