//! Video through `ffprobe` and `ffmpeg`, run as child processes when they
//! are installed: the facts people look for (duration, dimensions, codec,
//! frame rate) and a poster frame.
//!
//! Neither tool is linked or required: [`Ffmpeg::find`] looks for both on
//! `PATH`, and without them the ingest requests the video kinds `blocked`
//! with the reason [`NO_FFMPEG`]. *Why child processes:* a video decoder
//! is a large attack surface and a large build; a child is killed at its
//! time limit (a hostile or damaged file must not hang the ingest), its
//! crash is not ours, and the default build stays free of system
//! libraries.
//!
//! Each child reads only the file it is given (`file:` with the input's
//! protocols limited to `file`, so a playlist inside a file cannot make it
//! fetch anything), writes to a pipe, and is killed when its time limit
//! passes or its caller stops waiting.

use crate::error::MediaError;
use serde_json::{json, Value};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The reason video kinds are blocked where the tools are missing.
pub const NO_FFMPEG: &str = "ffmpeg not installed";

/// How long one `ffprobe` or `ffmpeg` run may take by default.
pub const DEFAULT_TOOL_TIME_LIMIT: Duration = Duration::from_secs(60);

/// The largest poster frame `ffmpeg` is asked for (its longest side).
const MAX_POSTER_SIDE: u32 = 4096;

/// Where `ffprobe` and `ffmpeg` are, and how long a run of either may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ffmpeg {
    pub ffprobe: PathBuf,
    pub ffmpeg: PathBuf,
    pub time_limit: Duration,
}

impl Ffmpeg {
    /// Both tools from `PATH`, or `None` when either is missing.
    pub fn find() -> Option<Ffmpeg> {
        Some(Ffmpeg {
            ffprobe: on_path("ffprobe")?,
            ffmpeg: on_path("ffmpeg")?,
            time_limit: DEFAULT_TOOL_TIME_LIMIT,
        })
    }

    pub fn with_time_limit(mut self, time_limit: Duration) -> Self {
        self.time_limit = time_limit;
        self
    }

    /// What `ffprobe` finds in the video at `path`.
    pub async fn probe(&self, path: &Path) -> Result<VideoFacts, MediaError> {
        let mut args: Vec<OsString> = ["-v", "error", "-protocol_whitelist", "file", "-print_format", "json"]
            .iter()
            .map(OsString::from)
            .collect();
        args.extend(["-show_format", "-show_streams", "-i"].map(OsString::from));
        args.push(file_url(path));
        let output = self.run(&self.ffprobe, "ffprobe", args).await?;
        let probed: Value = serde_json::from_slice(&output)
            .map_err(|error| MediaError::Unreadable(format!("ffprobe answered no JSON: {error}")))?;
        VideoFacts::from_probe(&probed)
    }

    /// One frame of the video at `path`, `at_seconds` in (the first frame
    /// when the video is shorter), at most `max_side` pixels on its
    /// longest side, upright as players show it.
    pub async fn poster_frame(
        &self,
        path: &Path,
        at_seconds: f64,
        max_side: u32,
    ) -> Result<image::DynamicImage, MediaError> {
        let side = max_side.clamp(1, MAX_POSTER_SIDE);
        let mut frame = self.frame_at(path, at_seconds, side).await?;
        if frame.is_empty() && at_seconds > 0.0 {
            frame = self.frame_at(path, 0.0, side).await?;
        }
        if frame.is_empty() {
            return Err(MediaError::Unreadable("ffmpeg found no video frame to show".into()));
        }
        image::load_from_memory_with_format(&frame, image::ImageFormat::Png)
            .map_err(|error| MediaError::Unreadable(format!("ffmpeg's poster frame does not decode: {error}")))
    }

    async fn frame_at(&self, path: &Path, at_seconds: f64, side: u32) -> Result<Vec<u8>, MediaError> {
        let mut args: Vec<OsString> = ["-v", "error", "-nostdin", "-protocol_whitelist", "file"]
            .iter()
            .map(OsString::from)
            .collect();
        args.extend([
            "-ss".into(),
            format!("{at_seconds:.3}").into(),
            "-i".into(),
            file_url(path),
        ]);
        let scale = format!("scale=w='min({side},iw)':h='min({side},ih)':force_original_aspect_ratio=decrease");
        args.extend(
            [
                "-frames:v",
                "1",
                "-an",
                "-vf",
                scale.as_str(),
                "-f",
                "image2pipe",
                "-vcodec",
                "png",
                "pipe:1",
            ]
            .map(OsString::from),
        );
        self.run(&self.ffmpeg, "ffmpeg", args).await
    }

    /// Runs `tool` to its end within the time limit; its standard output.
    async fn run(&self, program: &Path, tool: &str, args: Vec<OsString>) -> Result<Vec<u8>, MediaError> {
        let child = tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Dropped at the time limit, or with a stopped task: killed.
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| MediaError::Unreadable(format!("{tool} did not start: {error}")))?;
        let output = match tokio::time::timeout(self.time_limit, child.wait_with_output()).await {
            Ok(output) => output.map_err(|error| MediaError::Unreadable(format!("{tool} did not finish: {error}")))?,
            Err(_) => {
                return Err(MediaError::Unreadable(format!(
                    "{tool} did not finish within {} s; the file is damaged or hostile",
                    self.time_limit.as_secs_f64()
                )))
            }
        };
        if !output.status.success() {
            let said = String::from_utf8_lossy(&output.stderr);
            let said: String = said.trim().chars().take(300).collect();
            return Err(MediaError::Unreadable(format!(
                "{tool} refused the file ({}): {said}",
                output.status
            )));
        }
        Ok(output.stdout)
    }
}

/// `file:<path>`: the path read as a file, whatever it looks like.
fn file_url(path: &Path) -> OsString {
    let mut url = OsString::from("file:");
    url.push(path.as_os_str());
    url
}

/// The executable `name` in one of `PATH`'s folders.
fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|folder| folder.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
}

/// What a video is: its container, duration, and its first video stream's
/// dimensions, codec and frame rate (the audio codec when it has sound).
#[derive(Debug, Clone, PartialEq)]
pub struct VideoFacts {
    pub container: String,
    pub duration_seconds: Option<f64>,
    pub width: u32,
    pub height: u32,
    pub codec: String,
    pub frame_rate: Option<f64>,
    pub audio_codec: Option<String>,
}

impl VideoFacts {
    /// The facts from `ffprobe -show_format -show_streams` JSON.
    pub fn from_probe(probed: &Value) -> Result<VideoFacts, MediaError> {
        let streams = probed["streams"].as_array().map(Vec::as_slice).unwrap_or_default();
        let of_type = |kind: &str| streams.iter().find(|stream| stream["codec_type"] == kind);
        let Some(video) = of_type("video") else {
            return Err(MediaError::Unreadable("ffprobe found no video stream".into()));
        };
        let number = |value: &Value| {
            value
                .as_f64()
                .or_else(|| value.as_str().and_then(|text| text.parse::<f64>().ok()))
                .filter(|number| number.is_finite() && *number >= 0.0)
        };
        let dimension = |name: &str| {
            video[name]
                .as_u64()
                .and_then(|side| u32::try_from(side).ok())
                .unwrap_or(0)
        };
        let frame_rate = ["avg_frame_rate", "r_frame_rate"]
            .iter()
            .find_map(|name| video[*name].as_str().and_then(rational).filter(|rate| *rate > 0.0));
        Ok(VideoFacts {
            container: probed["format"]["format_name"]
                .as_str()
                .unwrap_or("unknown")
                .to_string(),
            duration_seconds: number(&probed["format"]["duration"]).or_else(|| number(&video["duration"])),
            width: dimension("width"),
            height: dimension("height"),
            codec: video["codec_name"].as_str().unwrap_or("unknown").to_string(),
            frame_rate,
            audio_codec: of_type("audio").and_then(|audio| audio["codec_name"].as_str().map(str::to_string)),
        })
    }

    /// Where a poster frame is taken: a tenth in, at most 5 s, so a fade
    /// from black is passed.
    pub fn poster_time(&self) -> f64 {
        self.duration_seconds.map_or(0.0, |duration| (duration / 10.0).min(5.0))
    }

    pub fn to_json(&self) -> Value {
        let mut facts = json!({
            "container": self.container,
            "duration_seconds": self.duration_seconds,
            "width": self.width,
            "height": self.height,
            "codec": self.codec,
            "frame_rate": self.frame_rate,
        });
        if let Some(audio) = &self.audio_codec {
            facts["audio_codec"] = json!(audio);
        }
        facts
    }
}

/// `30000/1001` as a number; `0/0` (unknown) as none.
fn rational(text: &str) -> Option<f64> {
    let (numerator, denominator) = text.split_once('/').unwrap_or((text, "1"));
    let (numerator, denominator) = (numerator.parse::<f64>().ok()?, denominator.parse::<f64>().ok()?);
    (denominator != 0.0)
        .then(|| numerator / denominator)
        .filter(|rate| rate.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_json_gives_the_first_video_streams_facts() {
        let probed = json!({
            "streams": [
                {"codec_type": "audio", "codec_name": "aac"},
                {"codec_type": "video", "codec_name": "h264", "width": 320, "height": 240,
                 "avg_frame_rate": "30000/1001", "r_frame_rate": "30/1"}
            ],
            "format": {"format_name": "mov,mp4,m4a,3gp,3g2,mj2", "duration": "2.000000"}
        });
        let facts = VideoFacts::from_probe(&probed).unwrap();
        assert_eq!((facts.width, facts.height, facts.codec.as_str()), (320, 240, "h264"));
        assert_eq!(facts.duration_seconds, Some(2.0));
        assert!((facts.frame_rate.unwrap() - 29.97).abs() < 0.01);
        assert_eq!(facts.audio_codec.as_deref(), Some("aac"));
        assert!((facts.poster_time() - 0.2).abs() < 1e-9);
        let no_video = json!({"streams": [{"codec_type": "audio"}], "format": {}});
        assert!(matches!(
            VideoFacts::from_probe(&no_video),
            Err(MediaError::Unreadable(_))
        ));
        assert_eq!(rational("0/0"), None);
    }
}
