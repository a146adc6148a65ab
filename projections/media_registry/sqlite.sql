-- media_registry, version 4 (SQLite).
-- The t: placeholder is replaced by the table's name where it is defined and
-- the r: placeholder where it is referenced, so the same text creates the live
-- tables, a shadow copy, or a scratch copy in another schema.
-- Entity tables are rowid tables keyed by a unique text PRIMARY KEY; only the
-- small counts tables are WITHOUT ROWID (why: docs/storage.md, "Entity
-- tables are rowid tables").
CREATE TABLE {{t:media}} (
    id             TEXT    PRIMARY KEY NOT NULL,
    path           TEXT    NOT NULL,
    media_kind     TEXT    NOT NULL,
    content_digest TEXT,
    byte_size      INTEGER CHECK (byte_size IS NULL OR byte_size >= 0),
    registered_at  TEXT    NOT NULL,
    updated_at     TEXT    NOT NULL,
    version        INTEGER NOT NULL CHECK (version >= 1)
);

-- Items by path, and of one media kind by path (version 4): lookups by
-- path and `media list`, walked in (path, id) order from a keyset position,
-- a path prefix as a range of paths.
CREATE INDEX {{t:media}}_by_path ON {{r:media}} (path, id);
CREATE INDEX {{t:media}}_by_kind ON {{r:media}} (media_kind, path, id);

CREATE TABLE {{t:media_regions}} (
    id              TEXT    PRIMARY KEY NOT NULL,
    media_id        TEXT    NOT NULL REFERENCES {{r:media}} (id) ON DELETE CASCADE,
    x               INTEGER NOT NULL CHECK (x >= 0),
    y               INTEGER NOT NULL CHECK (y >= 0),
    width           INTEGER NOT NULL CHECK (width >= 0),
    height          INTEGER NOT NULL CHECK (height >= 0),
    region_revision INTEGER NOT NULL,
    created_at      TEXT    NOT NULL
);

CREATE INDEX {{t:media_regions}}_by_media ON {{r:media_regions}} (media_id);

-- Running counts of registered media items and their regions (a removed
-- item's regions are subtracted as they cascade away), kept by the same fold as the rows they count,
-- so the dashboard reads a row instead of counting a table (version 3).
CREATE TABLE {{t:media_counts}} (
    name   TEXT    PRIMARY KEY NOT NULL,
    counts TEXT    NOT NULL
) WITHOUT ROWID;
