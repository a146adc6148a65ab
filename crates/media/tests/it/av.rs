//! Video and audio facts: the tools `ffprobe`/`ffmpeg` are child processes
//! killed at their time limit (a hostile file must not hang a worker), and
//! a sound file's facts are read in pure Rust.

use opledger_media::{audio_facts, classify_file, Ffmpeg, MediaError, MediaKind};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// A stand-in for a tool that never finishes (a decoder stuck on a hostile
/// file): a script that sleeps far beyond the time limit.
fn stuck_tool(dir: &Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, "#!/bin/sh\nexec sleep 60\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn a_tool_that_does_not_finish_is_killed_at_its_time_limit_and_the_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let video = dir.path().join("hostile.mp4");
    std::fs::write(&video, b"\0\0\0\x18ftypisom\0\0\0\0isomavc1").unwrap();
    let tools = Ffmpeg {
        ffprobe: stuck_tool(dir.path(), "ffprobe"),
        ffmpeg: stuck_tool(dir.path(), "ffmpeg"),
        time_limit: Duration::from_millis(300),
    };
    let started = Instant::now();
    let refused = tools.probe(&video).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(matches!(refused, MediaError::Unreadable(_)), "{refused:?}");
    assert!(refused.to_string().contains("did not finish within 0.3 s"), "{refused}");
    assert!(!refused.is_retryable());
    let refused = tools.poster_frame(&video, 0.0, 64).await.unwrap_err();
    assert!(refused.to_string().contains("ffmpeg did not finish"), "{refused}");
}

/// A 16-bit PCM WAV of `samples` samples per channel.
fn wav(rate: u32, channels: u16, samples: u32) -> Vec<u8> {
    let data_len = samples * u32::from(channels) * 2;
    let mut bytes = Vec::new();
    bytes.extend_from_slice(b"RIFF");
    bytes.extend_from_slice(&(36 + data_len).to_le_bytes());
    bytes.extend_from_slice(b"WAVEfmt ");
    bytes.extend_from_slice(&16u32.to_le_bytes());
    bytes.extend_from_slice(&1u16.to_le_bytes());
    bytes.extend_from_slice(&channels.to_le_bytes());
    bytes.extend_from_slice(&rate.to_le_bytes());
    bytes.extend_from_slice(&(rate * u32::from(channels) * 2).to_le_bytes());
    bytes.extend_from_slice(&(channels * 2).to_le_bytes());
    bytes.extend_from_slice(&16u16.to_le_bytes());
    bytes.extend_from_slice(b"data");
    bytes.extend_from_slice(&data_len.to_le_bytes());
    bytes.resize(bytes.len() + data_len as usize, 0x11);
    bytes
}

#[test]
fn a_wav_written_here_reads_as_audio_with_its_duration_rate_and_channels() {
    let bytes = wav(22_050, 2, 22_050 * 3 / 2);
    let facts = audio_facts(&bytes).unwrap();
    assert_eq!((facts.format.as_str(), facts.codec.as_str()), ("wav", "pcm"));
    assert_eq!(
        (facts.sample_rate, facts.channels, facts.bit_depth),
        (Some(22_050), Some(2), Some(16))
    );
    assert!((facts.duration_seconds - 1.5).abs() < 0.01, "{facts:?}");
    assert!(facts.tags.is_empty());

    let dir = tempfile::tempdir().unwrap();
    let named_like_a_photo = dir.path().join("IMG_0002.JPG");
    std::fs::write(&named_like_a_photo, &bytes).unwrap();
    assert_eq!(classify_file(&named_like_a_photo).unwrap().kind, MediaKind::Audio);
}

#[test]
fn bytes_that_are_no_audio_are_refused_as_unreadable_and_final() {
    for bytes in [&b"RIFF\x04\0\0\0WAVE"[..], b"fLaC\0\0", b"not a sound at all"] {
        let refused = audio_facts(bytes).unwrap_err();
        assert!(matches!(refused, MediaError::Unreadable(_)), "{refused:?}");
        assert!(!refused.is_retryable());
    }
}
