from clid.method import english as en


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
