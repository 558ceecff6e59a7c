"""The words synthetic prompts are made of, and the tiny test models' tokenizers are trained on (so that
each is one token there); the chat template those models carry (the server applies it to chat messages)."""

WORDS = (
    "the model server token batch cache request stream latency throughput speculative draft verify accept "
    "engine kernel memory bandwidth compute scheduler queue prefill decode attention layer weight tensor "
    "river mountain water light music city garden window letter paper story answer question number system "
    "quick slow small large early late bright dark warm cold open close begin finish measure compare report"
).split()

#: The generated models' chat template (Jinja, as a model's tokenizer config carries it): each message on a line
#: of its own after its role's tag, then the assistant's tag.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
