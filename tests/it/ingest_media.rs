//! `opledger ingest` on what a phone or camera library holds besides
//! photos: files are classified by their content (a PNG named `.jpg` is a
//! PNG image; a sound, a video and a text file are not images, and the
//! image kinds end `not_applicable` on them, never failed); a sound gets
//! its facts in pure Rust; a video gets its facts and a poster frame
//! through ffmpeg, and where ffmpeg is not installed its kinds are blocked
//! with the reason, which `status` says once, and run in the first ingest
//! that has ffmpeg; a HEIC photo in a build without HEIF support is
//! blocked likewise. `replay --verify` after each.
//!
//! The test that makes real videos needs ffmpeg: without it, it is
//! skipped loudly, except under `CI=true`, where it fails.

use crate::common;
use crate::ingest_support;

use common::{describe, opledger, stdout};
use ingest_support::{count, ingest, verify};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

const IMAGE_KINDS: [&str; 3] = ["metadata", "thumbnail", "perceptual_hash"];
const VIDEO_KINDS: [&str; 2] = ["video_metadata", "poster_frame"];

/// The folder the ingest reads, canonical (as the ledger records paths).
fn photos(dir: &Path) -> PathBuf {
    let photos = dir.join("photos");
    std::fs::create_dir_all(&photos).unwrap();
    std::fs::canonicalize(photos).unwrap()
}

/// `opledger --json ARGS` in `dir`, which must succeed; its answer.
fn ok_json(dir: &Path, args: &[&str]) -> Value {
    let output = opledger(dir).arg("--json").args(args).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{error}: {}", describe(&output)))
}

/// The media item at `path`: its kind, and each task kind's state.
struct Item {
    media_kind: String,
    tasks: Vec<(String, Value)>,
}

impl Item {
    fn read(dir: &Path, path: &Path) -> Item {
        let detail = ok_json(dir, &["media", "show", "--path", path.to_str().unwrap()]);
        let media_id = detail["media"]["media_id"].as_str().unwrap().to_string();
        let tasks = detail["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|capability| {
                let kind = capability["task_kind"].as_str().unwrap().to_string();
                let state = ok_json(dir, &["task", "show", "--media", &media_id, "--kind", &kind]);
                (kind, state)
            })
            .collect();
        Item {
            media_kind: detail["media"]["media_kind"].as_str().unwrap().to_string(),
            tasks,
        }
    }

    fn task(&self, kind: &str) -> &Value {
        &self
            .tasks
            .iter()
            .find(|(name, _)| name == kind)
            .unwrap_or_else(|| panic!("no {kind} task among {:?}", self.tasks))
            .1
    }

    fn status(&self, kind: &str) -> &str {
        self.task(kind)["status"].as_str().unwrap()
    }

    fn kinds(&self) -> Vec<&str> {
        let mut kinds: Vec<&str> = self.tasks.iter().map(|(kind, _)| kind.as_str()).collect();
        kinds.sort_unstable();
        kinds
    }
}

/// A mono 16-bit PCM WAV of `seconds` of a square wave at `rate` Hz,
/// written byte by byte.
fn write_wav(path: &Path, rate: u32, seconds: f64) {
    let samples = (f64::from(rate) * seconds) as u32;
    let data_len = samples * 2;
    let mut bytes = Vec::new();
    bytes.extend_from_slice(b"RIFF");
    bytes.extend_from_slice(&(36 + data_len).to_le_bytes());
    bytes.extend_from_slice(b"WAVEfmt ");
    bytes.extend_from_slice(&16u32.to_le_bytes());
    bytes.extend_from_slice(&1u16.to_le_bytes()); // PCM
    bytes.extend_from_slice(&1u16.to_le_bytes()); // mono
    bytes.extend_from_slice(&rate.to_le_bytes());
    bytes.extend_from_slice(&(rate * 2).to_le_bytes());
    bytes.extend_from_slice(&2u16.to_le_bytes());
    bytes.extend_from_slice(&16u16.to_le_bytes());
    bytes.extend_from_slice(b"data");
    bytes.extend_from_slice(&data_len.to_le_bytes());
    for sample in 0..samples {
        let value: i16 = if (sample / 20) % 2 == 0 { 8000 } else { -8000 };
        bytes.extend_from_slice(&value.to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

/// The first bytes of an MP4 and a HEIC file (their `ftyp` boxes), and
/// bytes after them that no decoder reads: enough to be classified.
fn write_ftyp(path: &Path, brand: &[u8; 4], compatible: &[u8]) {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&(16 + compatible.len() as u32).to_be_bytes());
    bytes.extend_from_slice(b"ftyp");
    bytes.extend_from_slice(brand);
    bytes.extend_from_slice(&0u32.to_be_bytes());
    bytes.extend_from_slice(compatible);
    bytes.extend_from_slice(&[0x5a; 512]);
    std::fs::write(path, bytes).unwrap();
}

/// A PNG of `width`×`height` in one colour.
fn write_png(path: &Path, width: u32, height: u32) {
    image::RgbImage::from_pixel(width, height, image::Rgb([10, 200, 30]))
        .save_with_format(path, image::ImageFormat::Png)
        .unwrap();
}

#[test]
fn files_are_classified_by_content_and_kinds_that_do_not_apply_are_not_applicable_not_failed() {
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path());
    let png = photos.join("really-a-png.jpg");
    write_png(&png, 40, 30);
    let wav = photos.join("tone.wav");
    write_wav(&wav, 8000, 0.5);
    let notes = photos.join("notes.txt");
    std::fs::write(&notes, "not a photo, not a sound\n").unwrap();
    let heic = photos.join("IMG_0001.HEIC");
    write_ftyp(&heic, b"heic", b"mif1heic");

    let summary = ingest(dir.path(), &[]);
    assert_eq!(count(&summary, "files"), 4, "{summary}");
    // The HEIC file is only its `ftyp` box: a build that decodes HEIF
    // fails it (one file failed), one that cannot blocks it.
    let failed = if opledger_media::HEIF_SUPPORT { 1 } else { 0 };
    assert_eq!(count(&summary, "failed"), failed, "{summary}");

    // The PNG named .jpg is a PNG image, and every image task succeeds.
    let item = Item::read(dir.path(), &png);
    assert_eq!(item.media_kind, "image");
    assert_eq!(item.kinds(), ["metadata", "perceptual_hash", "thumbnail"]);
    for kind in IMAGE_KINDS {
        assert_eq!(item.status(kind), "succeeded", "{kind}: {}", item.task(kind));
    }
    let metadata = &item.task("metadata")["output"];
    assert_eq!(
        (metadata["format"].as_str(), metadata["width"].as_u64()),
        (Some("png"), Some(40))
    );

    // The sound is audio: its own kind succeeds, the image kinds do not apply.
    let item = Item::read(dir.path(), &wav);
    assert_eq!(item.media_kind, "audio");
    assert_eq!(
        item.kinds(),
        ["audio_metadata", "metadata", "perceptual_hash", "thumbnail"]
    );
    for kind in IMAGE_KINDS {
        assert_eq!(item.status(kind), "not_applicable", "{kind}");
    }
    assert_eq!(
        item.status("audio_metadata"),
        "succeeded",
        "{}",
        item.task("audio_metadata")
    );
    let audio = &item.task("audio_metadata")["output"];
    assert_eq!(audio["format"], "wav");
    assert_eq!(audio["codec"], "pcm");
    assert_eq!(audio["sample_rate"], 8000);
    assert_eq!(audio["channels"], 1);
    let seconds = audio["duration_seconds"].as_f64().unwrap();
    assert!((seconds - 0.5).abs() < 0.01, "{audio}");

    // The text file is `other`: nothing applies to it.
    let item = Item::read(dir.path(), &notes);
    assert_eq!(item.media_kind, "other");
    assert_eq!(item.kinds(), ["metadata", "perceptual_hash", "thumbnail"]);
    for kind in IMAGE_KINDS {
        assert_eq!(item.status(kind), "not_applicable", "{kind}");
    }

    // The HEIC photo: a build that cannot decode HEIF blocks its image
    // kinds, with why; one that can fails them (the file is no photo).
    let item = Item::read(dir.path(), &heic);
    assert_eq!(item.media_kind, "image");
    for kind in IMAGE_KINDS {
        let expected = if opledger_media::HEIF_SUPPORT {
            "failed_terminal"
        } else {
            "blocked"
        };
        assert_eq!(item.status(kind), expected, "{kind}: {}", item.task(kind));
        if !opledger_media::HEIF_SUPPORT {
            assert_eq!(item.task(kind)["status_reason"], "built without HEIF support");
        }
    }
    verify(dir.path());

    // Nothing changed: a second run finds every file unchanged.
    let again = ingest(dir.path(), &[]);
    assert_eq!(count(&again, "unchanged"), 4, "{again}");
    verify(dir.path());
}

#[test]
fn an_item_whose_new_content_is_of_another_kind_takes_that_kind_and_its_kinds_run() {
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path());
    let sound_then_photo = photos.join("IMG_0002.jpg");
    write_wav(&sound_then_photo, 8000, 0.5);
    let photo_then_sound = photos.join("IMG_0003.jpg");
    write_png(&photo_then_sound, 40, 30);
    ingest(dir.path(), &[]);
    assert_eq!(Item::read(dir.path(), &sound_then_photo).media_kind, "audio");
    assert_eq!(Item::read(dir.path(), &photo_then_sound).media_kind, "image");

    // The same names, each now holding the other kind of content.
    write_png(&sound_then_photo, 64, 48);
    write_wav(&photo_then_sound, 8000, 0.25);
    let summary = ingest(dir.path(), &[]);
    assert_eq!(count(&summary, "files"), 2, "{summary}");
    assert_eq!(count(&summary, "failed"), 0, "{summary}");

    // The sound that became a photo is an image, and the image kinds that
    // did not apply to the sound run on the photo.
    let item = Item::read(dir.path(), &sound_then_photo);
    assert_eq!(item.media_kind, "image");
    for kind in IMAGE_KINDS {
        assert_eq!(item.status(kind), "succeeded", "{kind}: {}", item.task(kind));
    }
    assert_eq!(item.task("metadata")["output"]["width"], 64);

    // The photo that became a sound is audio: the sound's own kind applies
    // to it and runs (with the old kind it was not_applicable), and the
    // image kinds that succeeded on the photo do not apply to the sound at
    // its new revision (not run, and failed, on content they cannot read).
    let item = Item::read(dir.path(), &photo_then_sound);
    assert_eq!(item.media_kind, "audio");
    for kind in IMAGE_KINDS {
        assert_eq!(item.status(kind), "not_applicable", "{kind}: {}", item.task(kind));
        assert_eq!(
            item.task(kind)["attempt_count"],
            0,
            "{kind} is never claimed at the sound's revision: {}",
            item.task(kind)
        );
    }
    assert_eq!(
        item.status("audio_metadata"),
        "succeeded",
        "{}",
        item.task("audio_metadata")
    );
    let seconds = item.task("audio_metadata")["output"]["duration_seconds"]
        .as_f64()
        .unwrap();
    assert!((seconds - 0.25).abs() < 0.01, "{}", item.task("audio_metadata"));
    verify(dir.path());
}

#[test]
fn without_ffmpeg_on_path_a_videos_kinds_are_blocked_with_the_reason_and_status_says_so_once() {
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path());
    write_png(&photos.join("beach.png"), 32, 24);
    let clips = [photos.join("clip-1.mp4"), photos.join("clip-2.MOV.jpg")];
    for clip in &clips {
        write_ftyp(clip, b"isom", b"isomiso2avc1mp41");
    }
    // A PATH holding no ffmpeg (the binary itself is named by its path).
    let empty = dir.path().join("no-tools");
    std::fs::create_dir_all(&empty).unwrap();
    let without_ffmpeg = || {
        let mut command = opledger(dir.path());
        command.env("PATH", &empty);
        command
    };
    let output = ingest_support::run_ingest(without_ffmpeg(), &[]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(count(&summary, "failed"), 0, "{summary}");

    for clip in &clips {
        let item = Item::read(dir.path(), clip);
        assert_eq!(item.media_kind, "video", "{}", clip.display());
        for kind in IMAGE_KINDS {
            assert_eq!(item.status(kind), "not_applicable", "{kind}");
        }
        for kind in ["video_metadata", "poster_frame"] {
            assert_eq!(item.status(kind), "blocked", "{kind}");
            assert_eq!(item.task(kind)["status_reason"], "ffmpeg not installed");
        }
    }
    let beach = Item::read(dir.path(), &photos.join("beach.png"));
    assert_eq!(beach.kinds(), ["metadata", "perceptual_hash", "thumbnail"]);

    // A changed video (a new digest, so new revisions): the image kinds
    // stay not applicable and its own kinds stay blocked; nothing fails.
    write_ftyp(&clips[0], b"mp42", b"mp42isomavc1");
    let output = ingest_support::run_ingest(without_ffmpeg(), &[]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        (count(&summary, "changed"), count(&summary, "failed")),
        (1, 0),
        "{summary}"
    );
    let item = Item::read(dir.path(), &clips[0]);
    for kind in IMAGE_KINDS {
        assert_eq!(item.status(kind), "not_applicable", "{kind}");
    }
    for kind in ["video_metadata", "poster_frame"] {
        assert_eq!(item.status(kind), "blocked", "{kind}");
    }

    // `status` names the reason once, with how many it blocks and what
    // clears it.
    let output = without_ffmpeg().arg("status").output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let text = stdout(&output);
    assert_eq!(text.matches("ffmpeg not installed").count(), 1, "{text}");
    assert!(
        text.contains("ffmpeg not installed: 4 (poster_frame, video_metadata)\n    install ffmpeg"),
        "what clears the block follows it: {text}"
    );
    let status = ok_json(dir.path(), &["status"]);
    assert_eq!(status["blocked_by_reason"][0]["reason"], "ffmpeg not installed");
    assert_eq!(status["blocked_by_reason"][0]["count"], 4);
    verify(dir.path());
}

/// Whether ffmpeg and ffprobe run; a loud skip locally, a failure under
/// `CI=true`.
fn have_ffmpeg() -> bool {
    let runs = |tool: &str| {
        Command::new(tool)
            .arg("-version")
            .output()
            .is_ok_and(|output| output.status.success())
    };
    if runs("ffmpeg") && runs("ffprobe") {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("ffmpeg is not on PATH, and CI=true: the video tests must run in CI (apt-get install ffmpeg)");
    }
    eprintln!("\n*** SKIPPED: ffmpeg is not on PATH; the video ingest test did not run ***\n");
    false
}

/// Runs ffmpeg with `args` to success.
fn ffmpeg(args: &[&str]) {
    let output = Command::new("ffmpeg")
        .args(["-v", "error", "-nostdin", "-y"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "ffmpeg {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_video_gets_its_facts_and_a_poster_frame_and_a_sound_its_tags_while_image_kinds_do_not_apply() {
    if !have_ffmpeg() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path());
    let clip = photos.join("clip.mp4");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "color=c=red:s=320x240:d=2:r=25",
        "-c:v",
        "mpeg4",
        "-pix_fmt",
        "yuv420p",
        clip.to_str().unwrap(),
    ]);
    let song = photos.join("song.flac");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "sine=frequency=440:duration=1.5:sample_rate=44100",
        "-metadata",
        "title=Tuning Note",
        "-metadata",
        "artist=The Testers",
        "-c:a",
        "flac",
        song.to_str().unwrap(),
    ]);

    let summary = ingest(dir.path(), &[]);
    assert_eq!(count(&summary, "failed"), 0, "{summary}");

    let video = Item::read(dir.path(), &clip);
    assert_eq!(video.media_kind, "video");
    assert_eq!(
        video.kinds(),
        [
            "metadata",
            "perceptual_hash",
            "poster_frame",
            "thumbnail",
            "video_metadata"
        ]
    );
    for kind in IMAGE_KINDS {
        assert_eq!(video.status(kind), "not_applicable", "{kind}");
    }
    assert_eq!(
        video.status("video_metadata"),
        "succeeded",
        "{}",
        video.task("video_metadata")
    );
    let facts = &video.task("video_metadata")["output"];
    assert_eq!(
        (facts["width"].as_u64(), facts["height"].as_u64()),
        (Some(320), Some(240)),
        "{facts}"
    );
    assert_eq!(facts["codec"], "mpeg4", "{facts}");
    assert!((facts["frame_rate"].as_f64().unwrap() - 25.0).abs() < 0.01, "{facts}");
    assert!(
        (facts["duration_seconds"].as_f64().unwrap() - 2.0).abs() < 0.1,
        "{facts}"
    );

    assert_eq!(
        video.status("poster_frame"),
        "succeeded",
        "{}",
        video.task("poster_frame")
    );
    let poster = &video.task("poster_frame")["output"];
    assert_eq!(
        (poster["width"].as_u64(), poster["height"].as_u64()),
        (Some(256), Some(192)),
        "{poster}"
    );
    let frame = image::open(poster["path"].as_str().unwrap()).unwrap().to_rgb8();
    assert_eq!((frame.width(), frame.height()), (256, 192));
    let centre = frame.get_pixel(128, 96);
    assert!(
        centre[0] > 200 && centre[1] < 60 && centre[2] < 60,
        "the poster frame is red: {centre:?}"
    );

    let sound = Item::read(dir.path(), &song);
    assert_eq!(sound.media_kind, "audio");
    for kind in IMAGE_KINDS {
        assert_eq!(sound.status(kind), "not_applicable", "{kind}");
    }
    let audio = &sound.task("audio_metadata")["output"];
    assert_eq!(
        (audio["format"].as_str(), audio["codec"].as_str()),
        (Some("flac"), Some("flac")),
        "{audio}"
    );
    assert_eq!(audio["sample_rate"], 44100);
    assert!(
        (audio["duration_seconds"].as_f64().unwrap() - 1.5).abs() < 0.05,
        "{audio}"
    );
    assert_eq!(audio["tags"]["title"], "Tuning Note");
    assert_eq!(audio["tags"]["artist"], "The Testers");
    verify(dir.path());
}

#[test]
fn a_videos_kinds_blocked_for_want_of_ffmpeg_run_in_the_first_ingest_that_has_it() {
    if !have_ffmpeg() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path());
    // More clips than one image worker holds claims (32): their tasks
    // outlast a run that would not wait for them, since every file is
    // unchanged in the run that has ffmpeg and its pool stops claiming
    // once the files are done.
    let clips: Vec<PathBuf> = (0..20u32)
        .map(|shade| {
            let clip = photos.join(format!("clip-{shade}.mp4"));
            ffmpeg(&[
                "-f",
                "lavfi",
                "-i",
                &format!(
                    "color=c=0x{:02x}40{:02x}:s=160x120:d=1:r=10",
                    shade * 12,
                    255 - shade * 12
                ),
                "-c:v",
                "mpeg4",
                clip.to_str().unwrap(),
            ]);
            clip
        })
        .collect();
    let empty = dir.path().join("no-tools");
    std::fs::create_dir_all(&empty).unwrap();
    let mut without_ffmpeg = opledger(dir.path());
    without_ffmpeg.env("PATH", &empty);
    let output = ingest_support::run_ingest(without_ffmpeg, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let item = Item::read(dir.path(), &clips[0]);
    for kind in VIDEO_KINDS {
        assert_eq!(item.status(kind), "blocked", "{kind}");
    }

    // ffmpeg on PATH: every file is unchanged, and the blocked kinds run.
    let output = opledger(dir.path())
        .args(["--json", "ingest", "photos", "--workers", "1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(count(&summary, "unchanged"), clips.len() as u64, "{summary}");
    assert_eq!(count(&summary, "tasks_run"), 2 * clips.len() as u64, "{summary}");
    assert_eq!(summary["review_entries"], json!([]), "{summary}");
    for clip in &clips {
        let item = Item::read(dir.path(), clip);
        for kind in VIDEO_KINDS {
            assert_eq!(item.status(kind), "succeeded", "{kind}: {}", item.task(kind));
        }
        assert_eq!(item.task("video_metadata")["output"]["width"], 160);
    }
    // Each was retried as a person would from the review queue, with why.
    let item = Item::read(dir.path(), &clips[0]);
    let operation = item.task("poster_frame")["operation_id"].as_str().unwrap().to_string();
    let timeline = opledger(dir.path()).args(["timeline", &operation]).output().unwrap();
    assert_eq!(timeline.status.code(), Some(0), "{}", describe(&timeline));
    assert!(
        stdout(&timeline).contains("ffmpeg is installed now"),
        "{}",
        stdout(&timeline)
    );
    verify(dir.path());

    // Nothing is left for the next run.
    let again = ingest_support::run_ingest(opledger(dir.path()), &[]);
    let summary: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(count(&summary, "tasks_run"), 0, "{summary}");
}

#[test]
fn camera_raw_photos_get_metadata_a_thumbnail_and_a_hash_from_their_embedded_preview() {
    use opledger_media::raw_samples;
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path());
    // The preview as the sensor saw it (800 × 600); the RAWs' orientation
    // 6 displays it 600 × 800.
    let stored = image::RgbImage::from_fn(800, 600, |x, y| image::Rgb([(x / 4) as u8, (y / 3) as u8, 120]));
    let mut preview = Vec::new();
    image::DynamicImage::ImageRgb8(stored)
        .write_to(&mut std::io::Cursor::new(&mut preview), image::ImageFormat::Jpeg)
        .unwrap();
    let raws = [
        (
            "DSC_0001.NEF",
            raw_samples::tiff_raw(&preview, "NIKON CORPORATION", 6, false),
            "nef",
        ),
        ("IMG_0001.CR2", raw_samples::tiff_raw(&preview, "Canon", 6, true), "cr2"),
    ];
    for (name, bytes, _) in &raws {
        std::fs::write(photos.join(name), bytes).unwrap();
    }
    let summary = ingest(dir.path(), &[]);
    assert_eq!(
        (count(&summary, "files"), count(&summary, "failed")),
        (2, 0),
        "{summary}"
    );
    assert_eq!(summary["review_entries"], json!([]), "{summary}");
    for (name, _, format) in &raws {
        let item = Item::read(dir.path(), &photos.join(name));
        assert_eq!(item.media_kind, "image", "{name}");
        for kind in IMAGE_KINDS {
            assert_eq!(item.status(kind), "succeeded", "{name} {kind}: {}", item.task(kind));
        }
        let metadata = &item.task("metadata")["output"];
        assert_eq!(
            (
                metadata["format"].as_str(),
                metadata["width"].as_u64(),
                metadata["height"].as_u64()
            ),
            (Some(*format), Some(600), Some(800)),
            "{name}: {metadata}"
        );
        let thumbnail = &item.task("thumbnail")["output"];
        assert_eq!(
            (thumbnail["width"].as_u64(), thumbnail["height"].as_u64()),
            (Some(192), Some(256)),
            "{name}"
        );
        let written = image::open(thumbnail["path"].as_str().unwrap()).unwrap();
        assert_eq!(
            (written.width(), written.height()),
            (192, 256),
            "{name}: the file upright"
        );
    }
    let nef = Item::read(dir.path(), &photos.join("DSC_0001.NEF"));
    assert_eq!(nef.task("metadata")["output"]["exif"]["make"], "NIKON CORPORATION");
    verify(dir.path());
}
