from clid.base import english as en


def test_articles():
    assert en.with_article("apple") == "an apple"
    assert en.with_article("umbrella") == "an umbrella"
    assert en.with_article("unicycle") == "a unicycle"
    assert en.with_article("hour glass") == "an hour glass"
    assert en.with_article("red ball") == "a red ball"
    assert en.with_article("orange kite") == "an orange kite"


def test_plurals_and_counts():
    assert [en.pluralize(w) for w in ("dog", "box", "bus", "man", "person", "lady", "knife", "boy", "tennis ball")] == \
        ["dogs", "boxes", "buses", "men", "people", "ladies", "knives", "boys", "tennis balls"]
    for word in ("dog", "box", "man", "person", "lady", "glass", "bench"):
        assert en.singularize(en.pluralize(word)) == word
    assert en.count_phrase(1, "owl") == "an owl"
    assert en.count_phrase(2, "dog") == "two dogs"
    assert en.count_phrase(10, "cup") == "ten cups"
    assert en.count_phrase(12, "cup") == "12 cups"


def test_attribute_order_and_phrases():
    assert en.order_attributes(["striped", "red", "large", "red"]) == ["large", "red", "striped"]
    assert en.noun_phrase("ball", ["wooden", "small"]) == "a small wooden ball"
    assert en.noun_phrase("ball", ["orange"]) == "an orange ball"
    assert en.noun_phrase("ball", ["red"], definite=True) == "the ball"


def test_cleanup():
    assert en.remove_doubled_words("a a dog on on the the grass") == "a dog on the grass"
    assert en.finish_sentence("  a dog  on the grass . ") == "A dog on the grass."


def test_broken_phrases():
    """A caption's phrase is broken by a function word at its end, an article before a function word, an
    adjective before an article, or "a"/"an" against the next word's sound; whole captions are judged."""
    assert en.broken_phrase("a dog and a".split()) and en.broken_phrase("a man wearing".split())
    assert en.broken_phrase("a grass and a in front of a tree".split())
    assert en.broken_phrase("a woman on a gray the road".split())
    assert en.broken_phrase("a umbrella on the sand".split()) and en.broken_phrase("an dog".split())
    assert not en.broken_phrase("a woman in front of an umbrella on the sand".split())
    assert not en.broken_phrase("a man and a dog next to a table".split())
    assert not en.broken_phrase("a umbrella".split()[:1] + ["dog"])  # "a dog"
    assert not en.breaks_phrase("a", "umbrella", sound=False) and en.breaks_phrase("a", "umbrella")
    assert en.breaks_phrase("the", None) and not en.breaks_phrase("road", None)


def test_object_lists():
    """A caption lists objects when two or more of its parts between "and"s, at least half of them, are bare
    noun phrases; a sentence links its objects by verbs and prepositions."""
    assert en.object_list("a sand and a dress and a woman and a shirt and an umbrella and a water and water".split())
    assert en.object_list("a road and a tree and a woman wearing a dress".split())  # 2 of 3 parts bare
    assert not en.object_list("a woman is wearing a dress and is on a tree behind a bird".split())
    assert not en.object_list("a man wearing an orange shirt stands to the left of a gray metal bench".split())
    assert not en.object_list("a woman and a man on the snow".split())  # one bare part
    assert not en.object_list("a building and a painting and a man standing".split()[:5] + ["near", "it"])
    assert en.bare_noun_phrase("a tall building".split()) and not en.bare_noun_phrase("a man standing".split())
    assert not en.bare_noun_phrase([])


def test_fix_articles_keeps_the_word_count():
    assert en.fix_articles("a umbrella and an dog") == "an umbrella and a dog"
    assert en.fix_articles("A apple on a hour glass.") == "An apple on an hour glass."
    assert en.fix_articles("a a dog") == "a a dog"  # (an article before an article is left to the clean-up)
    assert en.fix_articles("a 3 dogs") == "a 3 dogs"
