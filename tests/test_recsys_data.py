"""MovieLens loaders (three layouts), the leave-one-out split and semantic IDs."""
from pathlib import Path

import numpy as np
import pytest
import torch

from zerogr_core.errors import ZeroGRError
from zerogr_core.recsys.data import BUNDLED_DIR, detect_layout, leave_one_out, load_movielens
from zerogr_core.recsys.semantic_ids import (SIDConfig, build_semantic_ids, collaborative_embeddings,
                                             collision_level, content_embeddings, content_tokens, kmeans, rq_kmeans)

# (user, movie, timestamp) in file order; user 3 has two ratings only, movie 99 is unlisted,
# user 1 rates movies 20 and 10 at the same second (file order must win).
RATINGS = [(1, 10, 100), (2, 30, 50), (1, 20, 90), (1, 30, 300), (2, 10, 60), (3, 10, 10), (1, 40, 90),
           (2, 20, 70), (2, 99, 80), (3, 20, 20), (2, 40, 40), (1, 10, 400)]
MOVIES = [(10, "Alpha (1995)", ["Comedy"]), (20, "Beta, The (1972)", ["Drama", "Crime"]),
          (30, "Gamma: Return (2001)", ["Sci-Fi"]), (40, "Délta (1960)", [])]
ML100K_GENRES = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
                 "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi",
                 "Thriller", "War", "Western"]


def write_latest(directory: Path, ratings=RATINGS, movies=MOVIES) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["userId,movieId,rating,timestamp"] + [f"{u},{m},4.0,{t}" for u, m, t in ratings]
    (directory / "ratings.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = ["movieId,title,genres"] + [f'{m},"{t}",{"|".join(g) or "(no genres listed)"}' for m, t, g in movies]
    (directory / "movies.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return directory


def write_ml1m(directory: Path, ratings=RATINGS, movies=MOVIES) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ratings.dat").write_bytes("".join(f"{u}::{m}::4::{t}\n" for u, m, t in ratings).encode("latin-1"))
    (directory / "movies.dat").write_bytes(
        "".join(f"{m}::{t}::{'|'.join(g)}\n" for m, t, g in movies).encode("latin-1"))
    return directory


def write_ml100k(directory: Path, ratings=RATINGS, movies=MOVIES) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "u.data").write_text("".join(f"{u}\t{m}\t4\t{t}\n" for u, m, t in ratings))
    lines = []
    for m, t, g in movies:
        flags = "|".join("1" if name in g else "0" for name in ML100K_GENRES)
        lines.append(f"{m}|{t}|01-Jan-1995||http://example.org/{m}|{flags}\n")
    (directory / "u.item").write_bytes("".join(lines).encode("latin-1"))
    return directory


@pytest.mark.parametrize("writer,layout", [(write_latest, "ml-latest-small"), (write_ml1m, "ml-1m"),
                                           (write_ml100k, "ml-100k")])
def test_three_layouts_load_identically(tmp_path, writer, layout):
    data = load_movielens(writer(tmp_path / layout))
    assert data.layout == layout
    assert data.item_ids.tolist() == [10, 20, 30, 40]
    assert data.titles.tolist() == ["Alpha (1995)", "Beta, The (1972)", "Gamma: Return (2001)", "Délta (1960)"]
    assert set(data.genres[1]) == {"Drama", "Crime"}
    assert data.genres[3] == ()
    assert data.user_ids.tolist() == [1, 2]          # user 3 has two ratings only
    assert data.dropped_users == 1 and data.dropped_ratings == 1   # movie 99 is not listed
    # user 1: t=90 (movie 20, then movie 40 by file order), 100 (10), 300 (30), 400 (10 again)
    assert data.item_ids[data.sequence(0)].tolist() == [20, 40, 10, 30, 10]
    assert data.item_ids[data.sequence(1)].tolist() == [40, 30, 10, 20]
    assert data.fingerprint() == load_movielens(write_latest(tmp_path / "again")).fingerprint()


def test_leave_one_out(tmp_path):
    data = load_movielens(write_ml1m(tmp_path))
    split = leave_one_out(data)
    ids = data.item_ids
    assert ids[split.train_sequence(0)].tolist() == [20, 40, 10]
    assert ids[split.valid_items].tolist() == [30, 10]
    assert ids[split.test_items].tolist() == [10, 20]
    assert ids[split.history(1, "test")].tolist() == [40, 30, 10]
    assert ids[split.history(1, "valid")].tolist() == [40, 30]
    assert split.train_counts(data.n_items).sum() == split.train_items.size == 5
    with pytest.raises(ZeroGRError, match="stage"):
        split.history(0, "train")


def test_missing_layout_names_the_directory(tmp_path):
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n")
    with pytest.raises(ZeroGRError, match=str(tmp_path).replace("\\", "\\\\") + ".*no MovieLens layout"):
        detect_layout(tmp_path)
    with pytest.raises(ZeroGRError, match="not found"):
        load_movielens(tmp_path / "nowhere")


def test_malformed_file_is_one_line_error(tmp_path):
    write_latest(tmp_path)
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,x,4.0,5\n")
    with pytest.raises(ZeroGRError) as err:
        load_movielens(tmp_path)
    assert str(tmp_path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name, text", [("movies.csv", "id,name,kind\n1,Heat (1995),Drama\n"),
                                        ("ratings.csv", "user,item,time\n1,1,100\n")])
def test_a_header_of_other_names_is_refused_not_read_by_position(tmp_path, name, text):
    # as many typed columns as the file has: Polars applied the types (and names) by position
    write_latest(tmp_path)
    (tmp_path / name).write_text(text)
    with pytest.raises(ZeroGRError, match=f"{name}: missing column"):
        load_movielens(tmp_path)


def test_bundled_copy_is_complete():
    assert detect_layout(BUNDLED_DIR) == "ml-latest-small"
    readme = (BUNDLED_DIR / "README.txt").read_text(encoding="utf-8")
    assert "GroupLens" in readme and "redistribute" in readme
    for name in ("ratings.csv", "movies.csv", "tags.csv", "links.csv"):
        assert (BUNDLED_DIR / name).is_file()


def test_content_tokens():
    assert content_tokens("Beta, The (1972)", ("Drama",)) == ["decade:1970", "genre:drama", "word:beta",
                                                              "word:the"]


def test_content_embeddings_skip_tokens_every_movie_has(tmp_path):
    # Every movie is a 1990s drama: those tokens have IDF 0, and a movie with no other shared token
    # had a zero norm, NaN rows, and train-movielens ended in the SVD's LinAlgError traceback.
    movies = [(10, "Alpha One (1995)", ["Drama"]), (20, "Alpha Two (1996)", ["Drama"]),
              (30, "Beta (1997)", ["Drama"]), (40, "Gamma (1998)", ["Drama"])]
    data = load_movielens(write_latest(tmp_path, movies=movies))
    emb = content_embeddings(data, 4, 0)
    assert torch.isfinite(emb).all()
    assert emb[2:].abs().sum() == 0 and torch.allclose(emb[0], emb[1])   # only "alpha" is shared
    sids = build_semantic_ids(data, leave_one_out(data), SIDConfig(levels=2, codebook_size=2, collab_dim=2,
                                                                   content_dim=2, kmeans_iters=5))
    assert np.unique(sids.catalog.sids, axis=0).shape[0] == data.n_items


def test_kmeans_keeps_every_cluster_and_is_seeded():
    x = torch.randn(200, 5, generator=torch.Generator().manual_seed(1))
    cent, assign = kmeans(x, 16, 20, torch.Generator().manual_seed(0))
    assert torch.bincount(assign, minlength=16).min() > 0
    cent2, assign2 = kmeans(x, 16, 20, torch.Generator().manual_seed(0))
    assert torch.equal(assign, assign2) and torch.equal(cent, cent2)


def test_rq_kmeans_and_collision_level_make_unique_sids():
    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(2))
    x[100:130] = x[100]                                   # 30 identical items must collide
    codes, sizes = rq_kmeans(x, levels=2, codebook_size=8, iters=15, seed=0)
    assert codes.shape == (300, 2) and all(codes[:, i].max() + 1 == s for i, s in enumerate(sizes))
    extra = collision_level(codes)
    full = np.concatenate([codes, extra[:, None]], axis=1)
    assert np.unique(full, axis=0).shape[0] == 300
    assert extra[100:130].tolist() == list(range(30))     # ranks in row order within the group


def test_collaborative_embeddings_use_training_interactions_only(tmp_path):
    data = load_movielens(write_ml1m(tmp_path / "a"))
    moved = [(u, m, t) for u, m, t in RATINGS]
    moved[-1] = (1, 30, 400)                              # user 1's test item changes from 10 to 30
    other = load_movielens(write_ml1m(tmp_path / "b", ratings=moved))
    a = collaborative_embeddings(leave_one_out(data), data.n_items, 2, 0)
    b = collaborative_embeddings(leave_one_out(other), other.n_items, 2, 0)
    assert torch.allclose(a, b)


def test_semantic_ids_on_bundled_data_are_unique_catalog_rows():
    data = load_movielens()
    split = leave_one_out(data)
    sids = build_semantic_ids(data, split, SIDConfig.preset("tiny"))
    cat = sids.catalog
    assert cat.n_items == data.n_items and cat.n_levels == 3
    assert np.unique(cat.sids, axis=0).shape[0] == cat.n_items
    assert np.array_equal(cat.item_ids[sids.row_of_item], data.item_ids)
    assert np.array_equal(sids.codes[sids.item_of_row], cat.sids.astype(np.int64))
    report = sids.report()
    assert report["codebook_sizes"] == list(cat.codebook_sizes)
    assert 0 <= report["collision_rate"] <= 1 and len(report["steps"]) == 3
