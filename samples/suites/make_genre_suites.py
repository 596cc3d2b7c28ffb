#!/usr/bin/env python3
"""Write quality suites of other genres than facts.json's town chronicles, so that a codec tuned on
one genre can be judged on text of a kind its tuner never saw (issue 30, leave-one-genre-out).

    python3 samples/suites/make_genre_suites.py     # from the repository root; stdlib only

Deterministic: one fixed seed per item, no clock, no environment, no set iteration. Every name,
code, identifier and fact is made up here from syllable and word lists; no third-party text.

Every question is a cloze: the opening of a sentence (a line, a table row, a line of code) that
appears exactly once in the item's context, the answer being its end, with 3 other answers of the
same kind from the same item as distractors (SmolLM2-135M is near chance with "Question: ...
Answer:" templates, see make_suites.py). The surface form differs per genre:

  meetings.json      minutes of invented committees: speakers' lines ("Name: ..."), resolutions
                     with proposer and seconder, action items with owner and due date
  inventory.json     depot ledgers: stock tables (| code | item | shelf | count |), cart
                     timetables (times), price lists (prices), a reorder list (item codes)
  code.json          Python modules of an invented system: constants, a config dict, classes and
                     their base classes, functions with typed defaults and the helper they return
  narrative.json     a story with many named characters: kin and friends, home towns, objects,
                     animals' names, told with dialogue
  instructions.json  a manual for invented machines: numbered steps (tools, waits, settings),
                     "You will need" lists and a troubleshooting list

Each item's continuation is the next part of the same document (a further agenda item, table,
function, chapter or procedure), scored for pooled delta perplexity and KL.

Measured (SmolLM2-135M-Instruct Q4_1, the default model; `kvscope-cli eval --suite S --codec fp16
--baselines fp16 --levels none --no-text --threads 1 --json`, 4 options, chance 0.25; context
tokens as prefilled, BOS and chat template included; continuations about 190 tokens each):

  suite         items  context tokens   questions  fp16 accuracy [Wilson 95 %]   by kind
  meetings      8      1571-3551         240        0.500 [0.369, 0.631] on the first 2 items (52 q):
                                                    due 0.78, seconder 0.75, amount 0.60, proposer 0.50,
                                                    objector 0.43, place 0.29, owner 0.25 (4-14 q each)
  inventory     8      1812-3649         240        0.775 [0.718, 0.823]: price 0.91, count 0.87,
                                                    leaves 0.77, arrives 0.73, shelf 0.62, code 0.58
  code          8      1493-3650         240        0.762 [0.705, 0.812]: default 0.89, string 0.84,
                                                    constant 0.84, config 0.76, returns 0.67, base 0.60
  narrative     8      1353-2901         240        0.575 [0.512, 0.636]: animal 0.71, friend 0.59,
                                                    home 0.58, object 0.53, kin 0.48
  instructions  8      1435-about 2810   240        0.346 [0.194, 0.538] on the first item (26 q), near
                                                    chance: tool 0.20, wait 0.43, part 0.40, setting 0.50

inventory and code sit a little above the 0.40-0.75 aimed at, not at the ceiling: the transform
codec's levels 1-3 already lose accuracy on code (0.654, 0.713, 0.725 against 0.762). instructions
is near chance and not fit as a held-out genre yet: its first item scored 0.346 both with a dozen
bare tool and part names repeated after many openings and with answers unique in their item (as
now); its step lines differ only in a part, a device and a number, so the opening does not single
out its line for this model. A next try: fewer, more distinct steps per procedure.
"""
import random
import sys

# The invented-name alphabet and the writer are facts.json's (make_suites.py), so both suite
# families draw names the same way.
from make_suites import CODAS, ONSETS, PLACE_SUFFIXES, VOWELS, write

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]


def syllables(rng, n):
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(n))


def word(rng, parts=2):
    return syllables(rng, parts).capitalize()


class World:
    """Unique invented names for one item."""

    def __init__(self, rng):
        self.rng = rng
        self.used = []

    def fresh(self, make, longest=16):
        while True:
            s = make()
            if s not in self.used and len(s) <= longest:
                self.used.append(s)
                return s

    def person(self):
        return self.fresh(lambda: word(self.rng, 1 + self.rng.randrange(2)) + " " + word(self.rng, 2))

    def given(self):
        return self.fresh(lambda: word(self.rng, 2), 9)

    def place(self):
        return self.fresh(lambda: word(self.rng, 1) + self.rng.choice(PLACE_SUFFIXES))

    def stem(self):
        """A lower-case invented word for identifiers and brands."""
        return self.fresh(lambda: syllables(self.rng, 2), 9)

    def distinct(self, make):
        return self.fresh(make, 64)


class Doc:
    """Blocks of text; each fact (kind, opening, answer) is a piece of a block's text."""

    def __init__(self):
        self.blocks = []  # (text, facts)

    def add(self, text, facts):
        for _, opening, answer, _ in facts:
            assert f"{opening} {answer}" in text or f"{opening}{answer}" in text, (opening, answer)
        self.blocks.append((text, facts))


def article(noun):
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def plural(noun):
    return noun[:-1] + "ies" if noun.endswith("y") else noun + "s"


def fact(kind, opening, answer, pool=None):
    """A piece of text `opening answer`; distractors come from the item's answers of the same pool
    (default: the same kind)."""
    return (kind, opening, answer, pool or kind)


def date(rng):
    return f"{1 + rng.randrange(28)} {rng.choice(MONTHS)}"


# ---- meetings --------------------------------------------------------------------------------

BODIES = ["harbour works committee", "market board", "water council", "bridge trust", "school board",
          "lamp and road committee", "guild of carters", "granary board", "festival committee"]
TOPICS = [("the east pier", "repair the east pier before the autumn storms"),
          ("the north gate", "close the north gate at dusk until the spring"),
          ("the market tolls", "raise the Saturday market toll by one penny"),
          ("the lamp oil", "buy the winter lamp oil from a single supplier"),
          ("the school roof", "reslate the school roof in the summer holiday"),
          ("the ferry", "run a second ferry on fair days"),
          ("the well on the green", "fence the old well on the green"),
          ("the flood bank", "raise the flood bank below the mill by two feet"),
          ("the granary", "sell the damp barley from the lower granary"),
          ("the night watch", "pay the night watch weekly instead of monthly"),
          ("the town clock", "send the town clock to be cleaned"),
          ("the salt road", "gravel the first mile of the salt road"),
          ("the bathhouse", "open the bathhouse on two more evenings"),
          ("the fire buckets", "replace the leather fire buckets with tin ones"),
          ("the mill race", "clear the mill race of weed twice a year"),
          ("the cemetery wall", "rebuild the fallen part of the cemetery wall"),
          ("the fair ground", "move the horse fair to the upper meadow"),
          ("the archive", "copy the oldest rolls of the archive"),
          ("the quay cranes", "grease the quay cranes before the herring season"),
          ("the bell", "recast the cracked chapel bell"),
          ("the stray goats", "fine the owners of stray goats on the green"),
          ("the tannery smell", "ask the tannery to move its pits downstream"),
          ("the chapel organ", "hire a tuner for the chapel organ"),
          ("the poor fund", "double the winter payments from the poor fund"),
          ("the boat sheds", "let the empty boat sheds to the net makers"),
          ("the ice house", "fill the ice house from the upper pond"),
          ("the weir", "repair the sluice boards of the weir"),
          ("the market cross", "clean the moss from the market cross"),
          ("the carters' yard", "pave the carters' yard with cobbles"),
          ("the orchard lease", "renew the lease of the town orchard for seven years")]
TASKS = ["write to the stone yard", "ask the miller for a price", "count the missing buckets",
         "measure the fallen wall", "visit the ferry house", "draft a notice for the market",
         "collect the tolls owed", "inspect the cellar", "speak to the blacksmith",
         "hire two labourers", "send the accounts to the treasurer", "order new hinges",
         "find the old plans", "test the pumps", "mark the boundary stones", "repaint the signboard",
         "check the oil store", "ask the chapel for the key", "weigh the barley",
         "bring the ledger to the next meeting", "meet the carters", "walk the flood bank",
         "price the timber", "clean the gutters", "buy a new padlock", "copy the minutes"]
SUPPLIERS = ["yard", "workshop", "brothers", "company", "forge", "carriers"]
THINGS = ["timber", "slates", "gravel", "oil", "rope", "lime", "iron work", "paint", "glass",
          "stone", "nails", "canvas", "tar", "bricks"]
ROUTES = ["towpath", "flood bank", "salt road", "quay wall", "mill lane", "boundary ditch",
          "market row", "upper meadow path"]
CHATTER = ["I agree with that.", "Can we have that in writing?", "Let us move on.",
           "I would like my doubts recorded.", "We discussed this last spring as well.",
           "That seems fair to me.", "The money is the question, as always.",
           "I have nothing to add.", "We should hear from the treasurer first.",
           "I saw it myself on Tuesday.", "Nobody has complained to me about it.",
           "It will cost more if we wait.", "Then let us put it to a vote."]


def meeting_block(rng, world, town, members, k, topic, task_pool):
    name, action = topic
    speakers = rng.sample(members, 4)
    lines, facts = [f"Item {k}: {name}."], []
    sup = f"{world.stem().capitalize()} {rng.choice(SUPPLIERS)}"
    thing = rng.choice(THINGS)
    amount = f"{rng.randrange(12, 990) * 10} crowns"
    op = f"{speakers[0]}: The quote from the {sup} for the {thing} came to"
    lines.append(f"{op} {amount}.")
    facts.append(fact("amount", op, amount))
    lines.append(f"{speakers[1]}: {rng.choice(CHATTER)}")
    route = rng.choice(ROUTES)
    place = world.place()
    op = f"{speakers[2]}: I walked the {route} on {rng.choice(['Monday', 'Tuesday', 'Thursday', 'Friday'])}, and the worst of it is near"
    lines.append(f"{op} {place}.")
    facts.append(fact("place", op, place))
    lines.append(f"{speakers[3]}: {rng.choice(CHATTER)}")
    proposer, seconder = rng.sample(members, 2)
    votes_for = rng.randrange(4, 8)
    if rng.random() < 0.5:
        op = f"Resolved: to {action} (proposed by"
        lines.append(f"{op} {proposer}, seconded by {seconder}; carried {votes_for} to {8 - votes_for}).")
        facts.append(fact("proposer", op, proposer, "member"))
    else:
        op = f"Resolved: to {action} (proposed by {proposer}, seconded by"
        lines.append(f"{op} {seconder}; carried {votes_for} to {8 - votes_for}).")
        facts.append(fact("seconder", op, seconder, "member"))
    if rng.random() < 0.5:
        objector = rng.choice([m for m in members if m not in (proposer, seconder)])
        op = f"Noted: the objection to the plan for {name} was raised by"
        lines.append(f"{op} {objector}.")
        facts.append(fact("objector", op, objector, "member"))
    for a in range(1 + rng.randrange(2)):
        task = task_pool.pop()
        owner = rng.choice(members)
        due = date(rng)
        if (k + a) % 2 == 0:
            op = f"ACTION {k}.{a + 1}: {task}. Owner:"
            facts.append(fact("owner", op, owner, "member"))
        else:
            op = f"ACTION {k}.{a + 1}: {task}. Owner: {owner}. Due:"
            facts.append(fact("due", op, due))
        lines.append(f"ACTION {k}.{a + 1}: {task}. Owner: {owner}. Due: {due}.")
    return "\n".join(lines), facts


def meetings_item(seed, agenda):
    rng = random.Random(seed)
    world = World(rng)
    town = world.place()
    members = [world.person() for _ in range(8)]
    body = rng.choice(BODIES)
    doc = Doc()
    chair = members[0]
    head = [f"MINUTES OF THE {body.upper()} OF {town.upper()}",
            f"Held in the town hall on {date(rng)}. Chair: {chair}.",
            "Present: " + ", ".join(members[1:]) + ".",
            f"{chair}: Welcome, all. The minutes of the last meeting were read and signed."]
    doc.add("\n".join(head), [])
    topics = rng.sample(TOPICS, agenda)
    tasks = rng.sample(TASKS, len(TASKS))
    k = 1
    for topic in topics:
        if not tasks:
            tasks = rng.sample(TASKS, len(TASKS))
        doc.add(*meeting_block(rng, world, town, members, k, topic, tasks))
        k += 1
    return town.lower(), doc


# ---- inventory -------------------------------------------------------------------------------

MATERIALS = ["brass", "iron", "copper", "oak", "ash", "tin", "hemp", "leather", "wool", "tarred",
             "waxed", "clay", "linen", "birch", "steel", "lead"]
GOODS = ["rivets", "hinges", "pegs", "buckets", "rope", "nails", "washers", "hooks", "straps",
         "pipes", "sheets", "rings", "wedges", "chains", "bolts", "spools", "tiles", "casks"]
SIZES = ["6 mm", "10 mm", "small", "large", "long", "short", "2 m", "5 m", "20 m", "heavy",
         "light", "narrow", "wide", "40 mm"]
PRICED = ["lamp oil, per jug", "barley, per sack", "salt, per stone", "candles, per dozen",
          "soap, per bar", "cheese, per wheel", "dried fish, per crate", "honey, per pot",
          "flour, per sack", "ink, per bottle", "tallow, per pound", "wool, per fleece",
          "cider, per keg", "oats, per sack", "pitch, per pail", "thread, per reel",
          "beeswax, per block", "vinegar, per flask", "lime, per barrow", "peat, per cart",
          "hay, per bale", "butter, per tub", "paper, per quire", "nails, per box"]


def code(world, rng):
    return world.distinct(lambda: rng.choice("BCDFGHKLMNPRSTVZ") + rng.choice("ABDEKLMRTW") + "-"
                          + str(1000 + rng.randrange(9000)))


def inventory_item(seed, tables):
    rng = random.Random(seed)
    world = World(rng)
    town = world.place()
    keeper = world.person()
    doc = Doc()
    doc.add(f"STORES LEDGER OF THE {town.upper()} DEPOT\nKept by {keeper}. Counts, carts and prices as "
            f"entered on {date(rng)}.", [])
    shelves = [f"{r}{n}" for r in "ABCDEFGH" for n in range(1, 20)]
    rng.shuffle(shelves)
    kinds = ["stock", "carts", "prices", "stock", "reorder", "carts", "stock", "prices"]
    for t in range(tables):
        kind = kinds[t % len(kinds)]
        lines, facts = [], []
        if kind == "stock":
            section = rng.choice(["north shed", "cellar", "loft", "yard store", "east room", "tool room"])
            lines += [f"Stock count, {section} (table {t + 1}):", "| code | item | shelf | count |",
                      "|---|---|---|---|"]
            for r in range(10):
                c = code(world, rng)
                item = world.distinct(lambda: f"{rng.choice(MATERIALS)} {rng.choice(GOODS)}, {rng.choice(SIZES)}")
                shelf = shelves.pop()
                count = str(rng.randrange(12, 990))
                if r % 2 == 0:
                    facts.append(fact("count", f"| {c} | {item} | {shelf} |", count))
                else:
                    facts.append(fact("shelf", f"| {c} | {item} |", shelf))
                lines.append(f"| {c} | {item} | {shelf} | {count} |")
        elif kind == "carts":
            lines += [f"Carts leaving the depot (table {t + 1}):", "| cart | to | leaves | arrives |",
                      "|---|---|---|---|"]
            for r in range(8):
                dest = world.place()
                h = 5 + rng.randrange(14)
                m = rng.randrange(12) * 5
                dur = 25 + rng.randrange(40) * 5
                leaves = f"{h:02d}:{m:02d}"
                e = h * 60 + m + dur
                arrives = f"{e // 60:02d}:{e % 60:02d}"
                cart = f"{t + 1}{r + 1}"
                if r % 2 == 0:
                    facts.append(fact("leaves", f"| {cart} | {dest} |", leaves))
                else:
                    facts.append(fact("arrives", f"| {cart} | {dest} | {leaves} |", arrives))
                lines.append(f"| {cart} | {dest} | {leaves} | {arrives} |")
        elif kind == "prices":
            lines.append(f"Price list (table {t + 1}), in crowns:")
            for good in rng.sample(PRICED, 9):
                price = f"{rng.randrange(1, 10)}.{rng.randrange(100):02d}"
                opening = f"- {good} ({world.stem().capitalize()}):"
                facts.append(fact("price", opening, price))
                lines.append(f"{opening} {price}")
        else:
            lines.append(f"To reorder before the winter (table {t + 1}):")
            for _ in range(8):
                c = code(world, rng)
                item = world.distinct(lambda: f"{rng.choice(MATERIALS)} {rng.choice(GOODS)}, {rng.choice(SIZES)}")
                opening = f"- {rng.randrange(2, 60) * 5} of the {item}, code"
                facts.append(fact("code", opening, c))
                lines.append(f"{opening} {c}")
        doc.add("\n".join(lines), facts)
    return town.lower(), doc


# ---- code ------------------------------------------------------------------------------------

VERBS = ["fetch", "parse", "merge", "flush", "load", "store", "scan", "split", "encode", "decode",
         "resolve", "render", "validate", "compact", "rotate", "index", "prune", "replay", "sign",
         "tally", "sort", "send", "drain", "wrap"]
NOUNS = ["record", "batch", "ledger", "entry", "queue", "header", "frame", "chunk", "token",
         "window", "spool", "cursor", "block", "label", "stamp", "route", "shard", "packet"]
SUFFIXES = ["Reader", "Writer", "Store", "Client", "Index", "Cache", "Queue", "Codec", "Pool",
            "Parser"]
UNITS = ["TIMEOUT_MS", "RETRY_LIMIT", "BATCH_SIZE", "PORT", "MAX_DEPTH", "BUFFER_BYTES",
         "POOL_SIZE", "BACKOFF_MS", "WINDOW", "SHARD_COUNT", "QUEUE_LIMIT", "TTL_SECONDS"]
DOCS = ["Return the {ns} that are ready.", "Read one {n} from the spool.", "Check a {n} before it is stored.",
        "Combine two lists of {ns}.", "Write every pending {n} to disk.", "Drop the {ns} that expired.",
        "Split a {n} into equal parts.", "Count the {ns} by label."]


def code_item(seed, modules):
    rng = random.Random(seed)
    world = World(rng)
    proj = world.stem()
    doc = Doc()
    doc.add(f'"""{proj}: the spool service of the {world.place()} depot (internal).\n\n'
            f'Reads records from the spool, checks them, and stores them in shards.\n"""\n'
            f"import os\nimport time\nfrom {proj}.core import Base{rng.choice(SUFFIXES)}", [])
    bases = []
    helpers = []
    for mnum in range(modules):
        lines, facts = [], []
        pick = mnum % 4
        if pick == 0:
            lines.append(f"# ---- limits ({mnum + 1})")
            for _ in range(5):
                name = world.distinct(lambda: world.stem().upper() + "_" + rng.choice(UNITS))
                value = str(rng.randrange(2, 99) * rng.choice([1, 10, 100]))
                facts.append(fact("constant", f"{name} =", value))
                lines.append(f"{name} = {value}")
            for _ in range(3):
                name = world.distinct(lambda: world.stem().upper() + "_" + rng.choice(["NAME", "PREFIX", "HOST", "TOPIC"]))
                value = f'"{world.stem()}-{rng.choice(NOUNS)}"'
                facts.append(fact("string", f"{name} =", value))
                lines.append(f"{name} = {value}")
        elif pick == 1:
            var = world.distinct(lambda: rng.choice(["DEFAULTS", "SETTINGS", "OPTIONS", "CONFIG"]) + "_" + world.stem().upper())
            lines.append(f"{var} = {{")
            for _ in range(6):
                key = world.distinct(lambda: f"{world.stem()}_{rng.choice(NOUNS)}")
                if rng.random() < 0.5:
                    value = f'"/var/{rng.choice(["spool", "lib", "cache", "log"])}/{world.stem()}"'
                else:
                    value = f'"{world.stem()}"'
                op = f'    "{key}":'
                facts.append(fact("config", op, value))
                lines.append(f"{op} {value},")
            lines.append("}")
        elif pick == 2:
            for _ in range(5):
                if len(bases) < 6:
                    bases.append(world.distinct(lambda: world.stem().capitalize() + rng.choice(SUFFIXES)))
                base = rng.choice(bases)
                cls = world.distinct(lambda: world.stem().capitalize() + rng.choice(SUFFIXES))
                field = rng.choice(NOUNS)
                op = f"class {cls}("
                facts.append(fact("base", op, base))
                lines += [f"class {cls}({base}):", f'    """Keeps the {plural(field)} of one shard."""',
                          f"    kind = \"{field}\"", "", f"    def __init__(self, path: str) -> None:",
                          f"        super().__init__(path)", f"        self.{plural(field)} = []", "", ""]
        else:
            for _ in range(6):
                noun = rng.choice(NOUNS)
                fn = world.distinct(lambda: f"{rng.choice(VERBS)}_{world.stem()}_{plural(noun)}")
                limit = rng.choice(["limit", "depth", "count", "width"])
                default = str(rng.randrange(2, 99))
                first = world.distinct(lambda: f"{rng.choice(VERBS)}_{world.stem()}")
                helper = world.distinct(lambda: f"{rng.choice(VERBS)}_{world.stem()}")
                helpers.append(helper)
                head = f"def {fn}(items: list, {limit}: int ="
                body = [f"{head} {default}) -> list:",
                        f'    """{rng.choice(DOCS).format(n=noun, ns=plural(noun))}"""',
                        f"    rows = {first}(items)",
                        f"    return {helper}(rows, {limit})"]
                if rng.random() < 0.5:
                    facts.append(fact("default", head, default))
                else:
                    facts.append(fact("returns", "\n".join(body[:3]) + "\n    return", helper))
                lines += body + ["", ""]
        doc.add("\n".join(lines).rstrip("\n"), facts)
    return proj, doc


# ---- narrative -------------------------------------------------------------------------------

OBJECTS = ["brass compass", "bone whistle", "silver thimble", "clay pipe", "folding knife",
           "leather journal", "glass bead", "copper key", "wooden flute", "tin lantern",
           "iron ring", "linen map", "painted egg", "pewter cup", "horn comb", "velvet purse",
           "carved spoon", "cracked mirror"]
ANIMAL_KINDS = ["grey mare", "black dog", "old goat", "white cat", "lame pony", "tame crow",
                "brown hound", "speckled hen", "young ox", "red fox cub"]
RELATIONS = [("{a} had been married for twenty years to", "kin"),
             ("The elder brother of {a} was called", "kin"),
             ("Ever since they were children, the closest friend of {a} had been", "friend"),
             ("The only person {a} trusted with the accounts was", "friend"),
             ("Years ago {a} had been apprenticed to", "kin"),
             ("The cousin who wrote to {a} every winter was", "kin"),
             ("On the road {a} had once been robbed by", "friend"),
             ("The neighbour who looked after the house of {a} was", "friend")]
HOMES = ["{a} had grown up in a narrow house above the harbour of",
         "Every spring {a} walked to the horse fair at",
         "{a} still owned a small field outside",
         "The family of {a} had come, long ago, from",
         "As a young man {a} had worked the ferry at"]
HOLDS = ["{a} always kept in a coat pocket a", "From a grandmother {a} had inherited a",
         "On the kitchen table {a} had left a", "Under the floorboards {a} had hidden a"]
PETS = ["{a} never went anywhere without a {k} named", "In the yard of {a} lived a {k} called"]
LINKS = ["The rain had not stopped for three days.", "Nobody spoke for a while.",
         "The fire in the grate was low, and the room smelled of smoke.",
         "Outside, a cart went past on the wet cobbles.", "It was nearly dark when they reached the bridge.",
         "The letter lay unopened on the chair.", "By morning the river had risen over the lower steps.",
         "Somewhere in the house a door banged."]
SAYS = ['"We leave at first light," said {a}.', '"I told you the bridge would not hold," said {a}.',
        '"Where is the key?" asked {a}.', '"Let me think about it," said {a}, and went out.',
        '"Nobody else knows," whispered {a}.', '"You are late again," said {a}.']


def narrative_item(seed, chapters):
    rng = random.Random(seed)
    world = World(rng)
    town = world.place()
    cast = [world.person() for _ in range(12)]
    doc = Doc()
    doc.add(f"THE WINTER AT {town.upper()}\n\nChapter 1\n\nThe snow came early to {town} that year, "
            f"and with it came {cast[0]}, who had been away for a long time.", [])
    for ch in range(chapters):
        sents, facts = [], []
        if ch:
            sents.append(f"Chapter {ch + 1}\n\n")
        for _ in range(7):
            a = rng.choice(cast)
            r = rng.randrange(10)
            if r < 3:
                tmpl, kind = rng.choice(RELATIONS)
                b = rng.choice([c for c in cast if c != a])
                op, ans = tmpl.format(a=a), b
            elif r < 5:
                op, ans, kind = rng.choice(HOMES).format(a=a), world.place(), "home"
            elif r < 7:
                op, ans, kind = rng.choice(HOLDS).format(a=a), rng.choice(OBJECTS), "object"
            elif r < 8:
                op, ans, kind = rng.choice(PETS).format(a=a, k=rng.choice(ANIMAL_KINDS)), world.given(), "animal"
            else:
                sents.append(rng.choice(SAYS).format(a=a) + " " + rng.choice(LINKS))
                continue
            if any(op == f[1] for f in facts):
                continue
            facts.append(fact(kind, op, ans))
            sents.append(f"{op} {ans}.")
            if rng.random() < 0.4:
                sents.append(rng.choice(LINKS))
        text = " ".join(sents).replace("\n\n ", "\n\n")
        doc.add(text, facts)
    return town.lower(), doc


# ---- instructions ----------------------------------------------------------------------------

DEVICES = ["pump", "press", "loom", "kiln", "winch", "still", "churn", "lathe", "boiler", "mangle",
           "bellows", "sieve"]
PARTS = ["feed valve", "drain cock", "tension screw", "side cover", "main spring", "oil cup",
         "guard plate", "drive belt", "relief pin", "float arm", "lower hinge", "cam wheel",
         "filter gauze", "pressure dial", "brake lever", "gear cap"]
TOOLS = ["7 mm spanner", "hex key", "wooden mallet", "flat chisel", "oil can", "wire brush",
         "long tweezers", "brass drift", "pin punch", "soft cloth", "bent awl", "pair of pliers"]
WAITS = ["seconds", "minutes"]
# Tools and parts named in an answer are unique in their item ("the long hex key", "the upper oil
# cup"): with a dozen bare names each repeated after many openings, fp16 scored 0.35 on the first
# item, near chance.
TOOL_SIZES = ["small", "large", "long", "short", "bent", "fine", "heavy", "narrow", "old", "spare"]
SIDES = ["left", "right", "upper", "lower", "front", "rear", "inner", "outer"]
TASKS_I = ["prime", "clean", "start", "shut down", "refill", "adjust", "inspect", "store"]


def instructions_item(seed, procedures):
    rng = random.Random(seed)
    world = World(rng)
    maker = world.place()
    devices = [f"{world.stem().capitalize()} {rng.choice(DEVICES)}" for _ in range(3)]
    doc = Doc()
    doc.add(f"CARE AND USE OF THE {maker.upper()} MACHINES\n\nRead every step before you begin. "
            f"Keep this manual with the machines: the {', the '.join(devices)}.", [])
    used_pairs = []
    for p in range(procedures):
        dev = devices[p % len(devices)]
        task = TASKS_I[(p // len(devices) + p) % len(TASKS_I)]
        lines, facts = [f"## How to {task} the {dev}", ""], []
        needs = rng.sample(TOOLS, 3)
        lines.append("You will need: " + ", ".join(article(t) for t in needs) + ".")
        lines.append("")
        for s in range(6):
            r = rng.randrange(4)
            part = rng.choice([q for q in PARTS if (dev, q, r) not in used_pairs])
            used_pairs.append((dev, part, r))
            n = s + 1
            if r == 0:
                tool = world.distinct(lambda: f"{rng.choice(TOOL_SIZES)} {rng.choice(TOOLS)}")
                op = f"{n}. Loosen the {part} of the {dev} with the"
                ans = tool
                kind = "tool"
                line = f"{op} {ans}."
            elif r == 1:
                ans = f"{rng.randrange(3, 60)} {rng.choice(WAITS)}"
                op = f"{n}. Turn the {part} of the {dev} a quarter turn and wait"
                kind = "wait"
                line = f"{op} {ans}."
            elif r == 2:
                ans = f"mark {rng.choice('ABCDEFGHJK')}{rng.randrange(1, 10)}"
                op = f"{n}. Set the {part} of the {dev} to"
                kind = "setting"
                line = f"{op} {ans}."
            else:
                ans = world.distinct(lambda: f"{rng.choice(SIDES)} {rng.choice([q for q in PARTS if q != part])}")
                op = f"{n}. Before you touch the {part} of the {dev}, check the"
                kind = "part"
                line = f"{op} {ans}."
            facts.append(fact(kind, op, ans))
            lines.append(line)
        if p % 2 == 1:
            fault = rng.choice(["stalls", "leaks", "knocks", "runs hot", "will not start"])
            ans = world.distinct(lambda: f"{rng.choice(SIDES)} {rng.choice(PARTS)}")
            op = f"If the {dev} {fault} during the {task}, replace the"
            facts.append(fact("part", op, ans))
            lines += ["", f"{op} {ans}."]
        doc.add("\n".join(lines), facts)
    return maker.lower(), doc


# ---- questions and items ---------------------------------------------------------------------

def build(gid, doc, told_blocks, questions, rng, cont_chars=(550, 800)):
    """Context = the first told_blocks blocks; continuation = the next ones up to cont_chars."""
    told = doc.blocks[:told_blocks]
    rest = doc.blocks[told_blocks:]
    context = "\n\n".join(t for t, _ in told)
    cont = ""
    for t, _ in rest:
        cont += "\n\n" + t
        if len(cont) >= cont_chars[0]:
            break
    if len(cont) < cont_chars[0]:
        raise SystemExit(f"{gid}: continuation of {len(cont)} chars, too short")
    if len(cont) > cont_chars[1]:
        cut = max(cont.rfind("\n", 0, cont_chars[1]), cont.rfind(". ", 0, cont_chars[1]) + 1)
        cont = cont[:cut if cut > cont_chars[0] else cont_chars[1]]
    facts = [f for _, fs in told for f in fs]
    by_kind = {}
    for _, _, answer, pool in facts:
        by_kind.setdefault(pool, [])
        if answer not in by_kind[pool]:
            by_kind[pool].append(answer)
    askable = [f for f in facts if len(by_kind[f[3]]) >= 4 and context.count(f[1]) == 1]
    if len(askable) < questions:
        raise SystemExit(f"{gid}: only {len(askable)} askable facts for {questions} questions")
    step = len(askable) / questions
    asked = [askable[int(i * step)] for i in range(questions)]
    out = []
    for kind, opening, answer, pool in asked:
        others = [a for a in by_kind[pool] if a != answer]
        choices = rng.sample(others, 3) + [answer]
        rng.shuffle(choices)
        out.append({"question": opening, "answer": answer, "choices": choices, "kind": kind})
    return {"id": gid, "context": context, "continuation": cont, "questions": out}


GENRES = {
    # name: (builder, [(seed, blocks told after the heading, questions)])
    "meetings": (meetings_item, [(401, 8, 26), (402, 8, 26), (403, 9, 28), (404, 10, 30),
                                 (405, 11, 30), (406, 13, 32), (407, 16, 34), (408, 18, 34)]),
    "inventory": (inventory_item, [(501, 8, 26), (502, 8, 26), (503, 9, 28), (504, 10, 30),
                                   (505, 11, 30), (506, 12, 32), (507, 14, 34), (508, 16, 34)]),
    "code": (code_item, [(601, 7, 26), (602, 7, 26), (603, 8, 28), (604, 9, 30),
                         (605, 10, 30), (606, 11, 32), (607, 13, 34), (608, 16, 34)]),
    "narrative": (narrative_item, [(701, 8, 26), (702, 8, 26), (703, 9, 28), (704, 10, 30),
                                   (705, 11, 30), (706, 12, 32), (707, 14, 34), (708, 17, 34)]),
    "instructions": (instructions_item, [(801, 8, 26), (802, 8, 26), (803, 9, 28), (804, 10, 30),
                                         (805, 11, 30), (806, 12, 32), (807, 14, 34), (808, 16, 34)]),
}


def make(genre):
    builder, plan = GENRES[genre]
    items = []
    for seed, told, questions in plan:
        gid, doc = builder(seed, told + 3)
        items.append(build(f"{gid}-{seed}", doc, told + 1, questions, random.Random(seed * 7 + 1)))
    return {"name": genre, "items": items}


def main():
    genres = sys.argv[1:] or list(GENRES)
    for genre in genres:
        suite = make(genre)
        write(genre + ".json", suite)
        items = suite["items"]
        kinds = {}
        for i in items:
            for q in i["questions"]:
                kinds[q["kind"]] = kinds.get(q["kind"], 0) + 1
        print(genre, len(items), "items,", sum(len(i["questions"]) for i in items), "questions,",
              [len(i["context"]) for i in items], "context chars,",
              [len(i["continuation"]) for i in items], "continuation chars,", kinds)


if __name__ == "__main__":
    main()
