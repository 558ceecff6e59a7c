"""The words synthetic prompts are made of, and the tiny test models' tokenizers are trained on (so that
each is one token there)."""

WORDS = (
    "the model server token batch cache request stream latency throughput speculative draft verify accept "
    "engine kernel memory bandwidth compute scheduler queue prefill decode attention layer weight tensor "
    "river mountain water light music city garden window letter paper story answer question number system "
    "quick slow small large early late bright dark warm cold open close begin finish measure compare report"
).split()
