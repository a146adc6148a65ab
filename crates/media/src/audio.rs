//! Audio: what people look for in a sound file (duration, codec, sample
//! rate, channels, tags), read in pure Rust with `lofty` from the bytes the
//! task checked, so the default build needs no system library.

use crate::error::MediaError;
use lofty::file::{AudioFile, FileType, TaggedFileExt};
use lofty::probe::Probe;
use lofty::tag::{Accessor, ItemKey};
use serde_json::{json, Map, Value};
use std::io::Cursor;

/// What an audio file is.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioFacts {
    /// The container (`wav`, `flac`, `mp3`, `mp4`, `ogg_vorbis`, ...).
    pub format: String,
    /// The codec its samples are in, as far as the container says.
    pub codec: String,
    pub duration_seconds: f64,
    pub sample_rate: Option<u32>,
    pub channels: Option<u8>,
    pub bit_depth: Option<u8>,
    pub bitrate_kbps: Option<u32>,
    /// The tags people search by, those present: `title`, `artist`,
    /// `album`, `genre`, `track`, `date`.
    pub tags: Map<String, Value>,
}

impl AudioFacts {
    pub fn to_json(&self) -> Value {
        json!({
            "format": self.format,
            "codec": self.codec,
            "duration_seconds": self.duration_seconds,
            "sample_rate": self.sample_rate,
            "channels": self.channels,
            "bit_depth": self.bit_depth,
            "bitrate_kbps": self.bitrate_kbps,
            "tags": self.tags,
        })
    }
}

/// Reads the facts of the audio file whose bytes are `bytes`; bytes that
/// are no audio container `lofty` knows are [`MediaError::Unreadable`].
pub fn audio_facts(bytes: &[u8]) -> Result<AudioFacts, MediaError> {
    let unreadable = |error: lofty::error::LoftyError| MediaError::Unreadable(format!("not readable audio: {error}"));
    let tagged = Probe::new(Cursor::new(bytes))
        .guess_file_type()
        .map_err(|error| MediaError::Unreadable(format!("not readable audio: {error}")))?
        .read()
        .map_err(unreadable)?;
    let properties = tagged.properties();
    let (format, codec) = names(tagged.file_type());
    let mut tags = Map::new();
    if let Some(tag) = tagged.primary_tag().or_else(|| tagged.first_tag()) {
        let texts = [
            ("title", tag.title()),
            ("artist", tag.artist()),
            ("album", tag.album()),
            ("genre", tag.genre()),
        ];
        for (name, value) in texts {
            if let Some(value) = value {
                tags.insert(name.to_string(), json!(value.as_ref()));
            }
        }
        if let Some(track) = tag.track() {
            tags.insert("track".to_string(), json!(track));
        }
        if let Some(date) = tag.get_string(&ItemKey::RecordingDate) {
            tags.insert("date".to_string(), json!(date));
        }
    }
    Ok(AudioFacts {
        format: format.to_string(),
        codec: codec.to_string(),
        duration_seconds: properties.duration().as_secs_f64(),
        sample_rate: properties.sample_rate(),
        channels: properties.channels(),
        bit_depth: properties.bit_depth(),
        bitrate_kbps: properties.audio_bitrate(),
        tags,
    })
}

/// The container's name and the codec it implies.
fn names(file_type: FileType) -> (&'static str, &'static str) {
    match file_type {
        FileType::Aac => ("aac", "aac"),
        FileType::Aiff => ("aiff", "pcm"),
        FileType::Ape => ("ape", "ape"),
        FileType::Flac => ("flac", "flac"),
        FileType::Mpeg => ("mp3", "mp3"),
        FileType::Mp4 => ("mp4", "mp4a"),
        FileType::Mpc => ("mpc", "musepack"),
        FileType::Opus => ("ogg_opus", "opus"),
        FileType::Vorbis => ("ogg_vorbis", "vorbis"),
        FileType::Speex => ("ogg_speex", "speex"),
        FileType::Wav => ("wav", "pcm"),
        FileType::WavPack => ("wavpack", "wavpack"),
        _ => ("unknown", "unknown"),
    }
}
