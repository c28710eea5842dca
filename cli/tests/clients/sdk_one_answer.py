"""One streamed answer as a user of the SDKs reads it, against a base URL given as argv[1]: argv[2]
is the API (`messages`: the anthropic SDK's `messages.stream`; `responses`: the openai SDK's
`responses.stream`), argv[3] the tokens asked. The SDK's own accumulator builds the final
message from the events (it raises on an event that names a block, an item or a part it has
not seen). Prints one JSON line: the text its text events carried, the final message's text,
its output tokens and why it ended.
"""
import json
import sys

base, api, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = ""
if api == "messages":
    import anthropic

    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=30)
    with client.messages.stream(
        model="sim", max_tokens=tokens, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        for event in stream:
            if event.type == "text":
                text += event.text
        message = stream.get_final_message()
    final = "".join(block.text for block in message.content if block.type == "text")
    output_tokens, ended = message.usage.output_tokens, message.stop_reason
else:
    import openai

    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=30)
    with client.responses.stream(model="sim", input="hi", max_output_tokens=tokens) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                text += event.delta
        response = stream.get_final_response()
    final = response.output_text
    output_tokens, ended = response.usage.output_tokens, response.status
print(json.dumps({"text": text, "final": final, "output_tokens": output_tokens, "ended": ended}))
