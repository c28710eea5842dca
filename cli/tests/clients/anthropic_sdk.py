"""The anthropic Python SDK as a user runs it, against a base URL given as argv[1].

After a warm-up, streams one message of argv[2] tokens with `messages.stream`, waiting at most argv[3] seconds
for each read (a stall longer than that is bridged only by the server's heartbeats), and prints
one JSON line: the text its text events carried, the final message's text, stop reason and
output tokens; then asks for max_tokens 0 and prints the error the SDK raised.
"""
import json
import sys

import anthropic

timeout = anthropic.Timeout(30, read=float(sys.argv[3]))
client = anthropic.Anthropic(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=timeout)
# Warm up: the first stream's events take the SDK a while to parse (its models are built then),
# so a stall in it could pass unnoticed. Two tokens: before the server's stall.
with client.messages.stream(
    model="sim", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
) as stream:
    stream.until_done()

text, events = "", 0
with client.messages.stream(
    model="sim", max_tokens=int(sys.argv[2]), messages=[{"role": "user", "content": "hi"}]
) as stream:
    for event in stream:
        events += 1
        if event.type == "text":
            text += event.text
    message = stream.get_final_message()
final = "".join(block.text for block in message.content if block.type == "text")
print(
    json.dumps(
        {
            "text": text,
            "final": final,
            "stop_reason": message.stop_reason,
            "output_tokens": message.usage.output_tokens,
            "events": events,
        }
    )
)

try:
    client.messages.create(model="sim", max_tokens=0, messages=[{"role": "user", "content": "hi"}])
    print(json.dumps({"error": None}))
except anthropic.APIStatusError as error:
    print(json.dumps({"error": type(error).__name__, "status": error.status_code}))
