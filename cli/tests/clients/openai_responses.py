"""The openai Python SDK's Responses API as a user runs it, against a base URL given as argv[1]
(a server that keeps a stream for a while after its client left).

After a warm-up, streams argv[2] tokens under the request id argv[3] with `responses.stream`, waiting at most
argv[4] seconds for each read (a longer stall is bridged only by the server's heartbeats), and
leaves after 5 text deltas; resumes with `responses.stream(response_id=..., starting_after=...)` (the SDK
replays the stream and skips what came before) and with `responses.retrieve(..., stream=True,
starting_after=...)` (the server skips it); prints one JSON line of what each got.
"""
import json
import sys

import openai

timeout = openai.Timeout(30, read=float(sys.argv[4]))
client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=timeout)
tokens, name = int(sys.argv[2]), sys.argv[3]

# Warm up: the first stream's events take the SDK a second or more to parse (its models are
# built then), so a stall in it would pass unnoticed. Two tokens: before the server's stall.
for _ in client.responses.create(model="sim", input="hi", max_output_tokens=2, stream=True):
    pass

first, last, response_id = [], None, None
with client.responses.stream(
    model="sim", input="hi", max_output_tokens=tokens, extra_headers={"x-request-id": name}
) as stream:
    for event in stream:
        last = event.sequence_number
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_text.delta":
            first.append(event.delta)
            if len(first) == 5:
                break

resumed, numbers = [], []
with client.responses.stream(response_id=response_id, starting_after=last) as stream:
    for event in stream:
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            resumed.append(event.delta)
    final = stream.get_final_response()

raw = client.responses.retrieve(response_id, stream=True, starting_after=last)
skipped = [event.delta for event in raw if event.type == "response.output_text.delta"]

print(
    json.dumps(
        {
            "response_id": response_id,
            "last": last,
            "first": "".join(first),
            "resumed": "".join(resumed),
            "numbers": numbers,
            "final": final.output_text,
            "status": final.status,
            "skipped": "".join(skipped),
        }
    )
)
