"""MkDocs hook: the committed benchmark figures (benchmarks/figures/*.png) join
the site as figures/*.png, so the pages show them without a second copy
inside docs/."""
import os

from mkdocs.structure.files import File

FIGURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "benchmarks", "figures")


def on_files(files, config):
    for name in sorted(os.listdir(FIGURES)):
        if name.endswith(".png"):
            files.append(File(f"figures/{name}", src_dir=os.path.dirname(FIGURES),
                              dest_dir=config["site_dir"], use_directory_urls=config["use_directory_urls"]))
    return files
