"""Self-generated captions: scene graphs prepared for 02's walk (graphs), English surface rules (english) and
the offline paraphraser (paraphrase).
"""
