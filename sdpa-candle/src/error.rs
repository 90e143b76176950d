//! sdpa errors as candle errors, with every cause in the text.

use sdpa_core::SdpaError;

/// Turns an sdpa error into a candle error whose message names the call and every cause down the chain
/// (an NVRTC log or a driver error in a backend's source stays readable from candle's side).
pub(crate) fn sdpa_err(e: SdpaError) -> candle_core::Error {
    let mut msg = format!("sdpa: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    candle_core::Error::Msg(msg).bt()
}
