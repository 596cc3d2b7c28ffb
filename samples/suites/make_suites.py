#!/usr/bin/env python3
"""Write the quality suites in this folder: invented chronicles of invented towns, each fact a
sentence whose end is the answer, asked as a cloze question (the sentence's opening).

    python3 samples/suites/make_suites.py          # from the repository root; stdlib only

Deterministic: one fixed seed per item, no clock, no environment. Every name, place and fact is
made up here from syllable lists; no third-party text.

Outputs (the suite format of core/eval/suite.h; "kind" is kvscope's optional per-question tag):
  facts.json     8 items (about 1K-3K SmolLM2 tokens each), cloze questions, 4 options each
                 (the gold answer and 3 other answers of the same kind from the same item)
  facts_qa.json  the same contexts and answers asked as "Question: ... Answer:" (for comparing
                 templates only: SmolLM2-135M sits near chance with it)
  facts_long.json  4 long items (about 4K, 5K, 6K and 7.6K SmolLM2 tokens; the last one close
                 to SmolLM2's 8192 positions with its questions), 30 cloze questions each, for
                 codecs on long contexts; made from other seeds, so no text is shared with facts.json
  mini.json      2 short items, 10 cloze questions each (CI tests and quick tuning loops)

Why cloze: on SmolLM2-135M, multiple choice by log-likelihood over such records is about 50%
right when the question is the opening of a sentence of the context (answered by copying) and
near chance with a Q/A template; only a suite the model scores well above chance can show a
codec's damage as lost accuracy.
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))

ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "r", "s", "st",
          "t", "th", "v", "w", "z"]
VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou"]
CODAS = ["", "n", "r", "l", "s", "th", "m", "nd", "rk", "st"]
PLACE_SUFFIXES = ["holm", "ford", "wick", "mere", "stead", "by", "thorpe", "vale", "gate", "moor"]
ROLES = ["harbour master", "mayor", "chief librarian", "head miller", "night warden", "bell ringer",
         "toll keeper", "schoolmistress", "ferry captain", "lamp keeper", "court scribe", "granary steward"]
BUILDINGS = ["stone bridge", "clock tower", "grain exchange", "chapel", "lighthouse", "town hall",
             "weaving hall", "east gate", "public bath", "salt store", "observatory", "market cross"]
TRADES = ["cooper", "glassblower", "saddler", "rope maker", "bookbinder", "chandler", "tanner",
          "wheelwright", "dyer", "clockmaker", "potter", "net mender", "cartographer", "brewer",
          "stonemason", "apothecary", "furrier", "locksmith"]
COLOURS = ["red", "green", "silver", "black", "golden", "blue", "white", "purple"]
ANIMALS = ["heron", "fox", "stag", "boar", "otter", "hawk", "salmon", "badger", "owl", "hare"]
FILLERS = [
    "The winter that year was long, and the roads stayed closed until the thaw.",
    "Merchants came up the river every autumn with salt, wool and dried fish.",
    "Most families kept a few goats and a small garden behind the house.",
    "The old records of the town were copied twice, once in ink and once in chalk.",
    "A fair was held on the green at midsummer, with music until late at night.",
    "Travellers often remarked on the smell of smoke and pine from the kilns.",
    "The council met in the evening, after the bells had rung for the last time.",
    "Floods reached the lower streets twice in a generation and then receded.",
    "Children learned their letters from slates that were passed from house to house.",
    "In dry summers the wells ran low and water was carried up from the river.",
    "Nobody in the town remembered a harvest as poor as the one that followed.",
    "The roads to the coast were improved with gravel and new milestones.",
]


def word(rng, parts=2):
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(parts)).capitalize()


class World:
    """Unique invented names and places for one item."""

    def __init__(self, rng):
        self.rng = rng
        self.used = set()

    def fresh(self, make):
        while True:
            s = make()
            if s not in self.used and len(s) <= 16:
                self.used.add(s)
                return s

    def person(self):
        return self.fresh(lambda: word(self.rng, 1 + self.rng.randrange(2)) + " " + word(self.rng, 2))

    def place(self):
        return self.fresh(lambda: word(self.rng, 1) + self.rng.choice(PLACE_SUFFIXES))


def facts_for(world, rng, town, count):
    """`count` facts, each (kind, opening, answer, qa question). Openings are unique in the item."""
    facts, openings = [], set()
    people, places = [], []
    kinds = ["person", "place", "year", "trade", "banner"]
    while len(facts) < count:
        kind = kinds[len(facts) % len(kinds)]
        if kind == "person":
            role, year = rng.choice(ROLES), 1600 + rng.randrange(300)
            where = rng.choice([town] + places) if places else town
            name = world.person()
            people.append(name)
            opening = f"In {year} the {role} of {where} was"
            fact = (kind, opening, name, f"Who was the {role} of {where} in {year}?")
        elif kind == "place":
            if not people:
                continue
            name = rng.choice(people)
            village = world.place()
            places.append(village)
            opening = f"{name} was born in the village of"
            fact = (kind, opening, village, f"In which village was {name} born?")
        elif kind == "year":
            building = rng.choice(BUILDINGS)
            where = rng.choice([town] + places)
            year = str(1500 + rng.randrange(400))
            opening = f"The {building} of {where} was finished in the year"
            fact = (kind, opening, year, f"In which year was the {building} of {where} finished?")
        elif kind == "trade":
            if not people:
                continue
            name = rng.choice(people)
            trade = rng.choice(TRADES)
            opening = f"For most of a lifetime {name} worked as a"
            fact = (kind, opening, trade, f"What was the trade of {name}?")
        else:
            house = world.person().split(" ")[-1]
            emblem = f"{rng.choice(COLOURS)} {rng.choice(ANIMALS)}"
            opening = f"The banner of the house of {house} shows a"
            fact = (kind, opening, emblem, f"What does the banner of the house of {house} show?")
        if fact[1] in openings:
            continue
        openings.add(fact[1])
        facts.append(fact)
    return facts


def item(seed, fact_count, questions, continuation_facts=5):
    rng = random.Random(seed)
    world = World(rng)
    town = world.place()
    facts = facts_for(world, rng, town, fact_count + continuation_facts)
    told, held_out = facts[:fact_count], facts[fact_count:]
    sentences = [f"This is the chronicle of {town}, a town on the river, as its scribes kept it."]
    for i, (_, opening, answer, _) in enumerate(told):
        sentences.append(f"{opening} {answer}.")
        if i % 3 == 2:
            sentences.append(rng.choice(FILLERS))
    paragraphs = [" ".join(sentences[i:i + 6]) for i in range(0, len(sentences), 6)]
    context = "\n\n".join(paragraphs)
    cont = [f"{opening} {answer}." for (_, opening, answer, _) in held_out]
    cont.insert(2, rng.choice(FILLERS))
    continuation = " ".join(cont)

    by_kind = {}
    for kind, _, answer, _ in told:
        by_kind.setdefault(kind, [])
        if answer not in by_kind[kind]:
            by_kind[kind].append(answer)
    # Ask evenly spread facts (from the start, the middle and the end of the context) whose kind
    # has 3 other answers in the item to serve as distractors.
    askable = [f for f in told if len(by_kind[f[0]]) >= 4]
    if len(askable) < questions:
        raise SystemExit(f"item {seed}: only {len(askable)} askable facts for {questions} questions")
    step = len(askable) / questions
    asked = [askable[int(i * step)] for i in range(questions)]
    cloze, qa = [], []
    for kind, opening, answer, question in asked:
        others = [a for a in by_kind[kind] if a != answer]
        distractors = rng.sample(others, 3)
        choices = distractors + [answer]
        rng.shuffle(choices)
        cloze.append({"question": opening, "answer": answer, "choices": choices, "kind": "cloze_" + kind})
        qa.append({"question": f"Question: {question}\nAnswer:", "answer": answer, "choices": choices,
                   "kind": "qa_" + kind})
    base = {"id": town.lower(), "context": context, "continuation": continuation}
    return dict(base, questions=cloze), dict(base, questions=qa)


def write(name, suite):
    with open(os.path.join(HERE, name), "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(suite, indent=1, ensure_ascii=False) + "\n")


def main():
    # (seed, facts told in the context, questions asked): about 24 tokens a fact with fillers.
    plan = [(101, 44, 28), (102, 44, 28), (103, 50, 30), (104, 56, 30),
            (105, 64, 32), (106, 76, 32), (107, 96, 34), (108, 120, 36)]
    full = [item(*p) for p in plan]
    write("facts.json", {"name": "facts", "items": [c for c, _ in full]})
    write("facts_qa.json", {"name": "facts_qa", "items": [q for _, q in full]})
    # Long contexts: the same recipe with more facts told (about 23 tokens a fact).
    long_plan = [(301, 172, 30), (302, 215, 30), (303, 258, 30), (304, 328, 30)]
    long_items = [item(*p)[0] for p in long_plan]
    write("facts_long.json", {"name": "facts_long", "items": long_items})
    mini = [item(201, 22, 10)[0], item(202, 24, 10)[0]]
    write("mini.json", {"name": "mini", "items": mini})
    for name, items in (("facts", [c for c, _ in full]), ("facts_long", long_items), ("mini", mini)):
        print(name, len(items), "items,", sum(len(i["questions"]) for i in items), "questions,",
              [len(i["context"]) for i in items], "context chars")


if __name__ == "__main__":
    main()
