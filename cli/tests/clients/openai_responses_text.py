"""The openai Python SDK's `responses.stream` against a base URL given as argv[1]: prints one
JSON line, the text its text events carried and the final response's text, or the error the
SDK raised (its type and message) if it could not read the stream.
"""
import json
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=30)
try:
    text = ""
    with client.responses.stream(model="sim", input="hi", max_output_tokens=8) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                text += event.delta
    print(json.dumps({"text": text, "error": None}))
except Exception as error:  # what a user of the SDK would see
    print(json.dumps({"text": None, "error": f"{type(error).__name__}: {error}"}))
