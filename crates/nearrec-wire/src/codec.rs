//! The protocol's codec: prost's, but a request that does not decode is the caller's mistake,
//! `INVALID_ARGUMENT` (as Armeria and grpc-java's services answer it), not `INTERNAL`, which
//! stays for the node's own faults. An answer that does not decode is still `INTERNAL`: the
//! node's fault, seen by the client.
//!
//! Its buffers grow once per message: a message is encoded into a buffer reserved to its
//! encoded length (prost's would grow from 8 KiB by doubling, copying what it holds each
//! time), and one arriving is gathered into a buffer that starts empty and is reserved to the
//! length its gRPC header gives (not 8 KiB first, then grown as its frames come).

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// [`ProstCodec`] with requests that do not decode answered `INVALID_ARGUMENT` (`build.rs`
/// generates the server and client over it).
#[derive(Debug, Clone, Default)]
pub struct NodeCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Codec for NodeCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = NodeEncoder<T>;
    type Decoder = NodeDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        NodeEncoder(self.0.encoder())
    }

    fn decoder(&mut self) -> Self::Decoder {
        NodeDecoder(self.0.decoder())
    }
}

/// tonic's default: a stream's answers encoded past this many bytes are sent before the next.
const YIELD_THRESHOLD: usize = 32 << 10;

/// [`ProstEncoder`] into a buffer reserved to the message's encoded length.
#[derive(Debug, Clone)]
pub struct NodeEncoder<T>(ProstEncoder<T>);

impl<T: prost::Message> Encoder for NodeEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        self.0.encode(item, buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        // the first reserve above makes the buffer: no 8 KiB one before it
        BufferSettings::new(0, YIELD_THRESHOLD)
    }
}

/// [`ProstDecoder`], its failures on a request (a message named `…Request`) re-coded.
#[derive(Debug, Clone)]
pub struct NodeDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for NodeDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| {
            let path = std::any::type_name::<U>();
            let name = path.rsplit("::").next().unwrap_or("");
            let package = match path.contains("::inference::") {
                true => "inference",
                false => "nearrec.v1",
            };
            if name.ends_with("Request") {
                Status::invalid_argument(format!(
                    "the request does not decode as {package}.{name}: {}",
                    s.message()
                ))
            } else {
                s
            }
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        // gathered from empty: the message's first frame, then its length reserved at once
        BufferSettings::new(0, YIELD_THRESHOLD)
    }
}
